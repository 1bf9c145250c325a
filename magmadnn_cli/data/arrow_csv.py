"""The fast path for whole CSV files: pyarrow's multithreaded C++ reader (4-8x numpy's line parser
on numbers, benchmarks/csv_read.py; 10x and more on text columns, benchmarks/columnar_read.py), its
columns typed by pyarrow and turned into a table as Parquet's are (`columnar.batch_table`). Anything
it does not take (a ragged row, a decoding error, pyarrow not installed) returns None, and the line
reader reads the file instead, with its file:line messages: the two give identical tables (tested)."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import signals
from .cells import MISSING
from .csv_reader import CsvFormat
from .text_source import DECOMPRESSORS, READ_ERRORS, ReadBound, is_stream, stream_bytes

try:
    import pyarrow as pa
    import pyarrow.csv as pacsv
except ImportError:  # the line reader does everything without it
    pa = None

NULLS = sorted({spelling for token in MISSING for spelling in (token, token.upper(), token.capitalize())})


def _source(path: Path, bound: ReadBound) -> "pa.NativeFile | None":
    """The file's bytes for pyarrow, their text and rows counted by `bound` first (which refuses a
    file past the memory budget): a memory map of a plain file, the text inflated in memory
    READ_BYTES at a time, or a stream's bytes; None leaves a compressed stream to the line reader."""
    suffix = path.suffix.lower()
    if is_stream(path):
        if suffix in DECOMPRESSORS:
            return None
        data = stream_bytes(path)
        bound.add(len(data), data.count(b"\n"))
        return pa.BufferReader(data)
    if suffix in DECOMPRESSORS:
        with DECOMPRESSORS[suffix](path, "rb") as f:
            return pa.BufferReader(bound.read_all(f))
    source = pa.memory_map(str(path), "r")
    for offset in range(0, source.size(), SCAN_BYTES):
        piece = np.frombuffer(source.read_at(min(SCAN_BYTES, source.size() - offset), offset), dtype=np.uint8)
        bound.add(len(piece), int(np.count_nonzero(piece == NEWLINE)))
    return source


SCAN_BYTES, NEWLINE = 1 << 26, ord("\n")  # a plain file's rows are counted 64 MiB at a time (~0.1 s per GiB)


def read_typed(path: Path, fmt: CsvFormat, features: list[str], target: str | None, text: list[str],
               bound: ReadBound | None = None, labels: tuple[str, ...] = ()) -> "pa.Table | None":
    """The file's feature and target columns as pyarrow types them (numbers, strings, booleans,
    dates; the `text` columns, the target and the 0/1 `labels` columns as strings; missing cells
    null), or None. The text and its rows are counted by `bound` before any is parsed."""
    if pa is None:
        return None
    as_text = text + ([target] if target else []) + list(labels)
    wanted = features + ([target] if target else []) + list(labels)
    try:
        source = _source(path, bound or ReadBound(path))
        if source is None:
            return None
        table = pacsv.read_csv(
            source,
            read_options=pacsv.ReadOptions(encoding=codecs.lookup(fmt.encoding).name, block_size=1 << 24,
                                           column_names=list(fmt.names) if fmt.names else None,
                                           skip_rows=int(bool(fmt.names) and fmt.header)),
            parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                include_columns=wanted, null_values=NULLS, strings_can_be_null=True, decimal_point=fmt.decimal,
                true_values=[], false_values=[],  # booleans stay text as written, as the line reader reads them
                column_types={name: pa.string() for name in as_text}))
    except pa.ArrowCancelled as exc:  # SIGINT/SIGTERM stopped the read: pass it on (a fallback would lose it)
        raise KeyboardInterrupt from exc
    except (pa.ArrowException, *READ_ERRORS, ValueError, LookupError, UnicodeError):
        signals.check()  # the line reader takes the file, unless a stop signal caused the error
        return None
    return table if table.column_names == wanted and table.num_rows else None


class StreamFailed(Exception):
    """pyarrow's streaming reader refused the file part way (a ragged row, a decoding error): the
    line reader goes on from the rows already read, and names what is wrong by line."""


STREAM_BYTES = 1 << 23  # bytes of CSV text per streamed block (8 MiB, as the line reader's chunks)


def _stream_input(path: Path) -> Any:
    suffix = path.suffix.lower()
    if is_stream(path):
        return None if suffix in DECOMPRESSORS else pa.BufferReader(stream_bytes(path))
    return DECOMPRESSORS[suffix](path, "rb") if suffix in DECOMPRESSORS else pa.OSFile(str(path), "rb")


def stream_cells(path: Path, fmt: CsvFormat, columns: list[str]) -> Iterator[Any] | None:
    """Record batches of `columns` as text (missing cells null), about STREAM_BYTES of the file
    each, from pyarrow's streaming reader; None where it cannot start. A failure part way raises
    StreamFailed."""
    if pa is None:
        return None
    try:
        source = _stream_input(path)
        if source is None:
            return None
        reader = pacsv.open_csv(
            source,
            read_options=pacsv.ReadOptions(encoding=codecs.lookup(fmt.encoding).name, block_size=STREAM_BYTES,
                                           column_names=list(fmt.names) if fmt.names else None,
                                           skip_rows=int(bool(fmt.names) and fmt.header)),
            parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(include_columns=columns, null_values=NULLS, strings_can_be_null=True,
                                                 column_types={c: pa.string() for c in columns}))
    except pa.ArrowCancelled as exc:
        raise KeyboardInterrupt from exc
    except (pa.ArrowException, *READ_ERRORS, ValueError, LookupError, UnicodeError):
        signals.check()
        return None
    return _batches(reader)


def _batches(reader: Any) -> Iterator[Any]:
    try:
        yield from reader
    except pa.ArrowCancelled as exc:
        raise KeyboardInterrupt from exc
    except (pa.ArrowException, *READ_ERRORS, ValueError, UnicodeError) as exc:
        signals.check()
        raise StreamFailed(str(exc)) from exc
