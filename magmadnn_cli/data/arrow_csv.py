"""The fast path for whole CSV files: pyarrow's multithreaded C++ reader (4-8x numpy's line parser
here, benchmarks/csv_read.py) for the common case of numeric feature columns, missing cells
allowed. Anything it does not take as such (text in a feature column, a ragged row, a decoding
error, pyarrow not installed) returns None, and the line reader reads the file instead, with its
file:line messages: the two give identical tables (tested)."""

from __future__ import annotations

import codecs
from pathlib import Path

import numpy as np

from .. import signals
from ..core import backend as B
from .columns import MISSING
from .csv_reader import DECOMPRESSORS, CsvFormat, is_stream, stream_bytes

try:
    import pyarrow as pa
    import pyarrow.csv as pacsv
except ImportError:  # the line reader does everything without it
    pa = None

NULLS = sorted({spelling for token in MISSING for spelling in (token, token.upper(), token.capitalize())})


def _source(path: Path) -> "pa.NativeFile | None":
    """The file's bytes for pyarrow: a memory map of a plain file, the text inflated in memory
    (bounded as the line reader bounds it), or a stream's bytes; None leaves the file to the line
    reader (a compressed stream, or text past the bound, which it refuses with its message)."""
    suffix = path.suffix.lower()
    if is_stream(path):
        return None if suffix in DECOMPRESSORS else pa.BufferReader(stream_bytes(path))
    if suffix not in DECOMPRESSORS:
        return pa.memory_map(str(path), "r")
    limit = (B.host_memory_available() or 2**40) // 2
    with DECOMPRESSORS[suffix](path, "rb") as f:
        data = f.read(limit + 1)
    return pa.BufferReader(data) if len(data) <= limit else None


def read_numeric(path: Path, fmt: CsvFormat, features: list[str], target: str | None,
                 dtype: type) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(features as a dtype matrix, NaN where missing; target cells as text) or None."""
    if pa is None:
        return None
    wanted = features + ([target] if target else [])
    kind = pa.float64() if np.dtype(dtype) == np.float64 else pa.float32()
    try:
        source = _source(path)
        if source is None:
            return None
        table = pacsv.read_csv(
            source,
            read_options=pacsv.ReadOptions(encoding=codecs.lookup(fmt.encoding).name, block_size=1 << 24,
                                           column_names=list(fmt.names) if fmt.names else None,
                                           skip_rows=int(bool(fmt.names) and fmt.header)),
            parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                include_columns=wanted, null_values=NULLS, strings_can_be_null=False,
                column_types={**{f: kind for f in features}, **({target: pa.string()} if target else {})}))
    except pa.ArrowCancelled as exc:  # SIGINT/SIGTERM stopped the read: pass it on (a fallback would lose it)
        raise KeyboardInterrupt from exc
    except (pa.ArrowException, OSError, EOFError, ValueError, LookupError, UnicodeError):
        signals.check()  # the line reader takes the file, unless a stop signal caused the error
        return None
    if table.column_names != wanted or table.num_rows == 0:
        return None
    x = np.empty((table.num_rows, len(features)), dtype=dtype)
    for j, name in enumerate(features):
        x[:, j] = table.column(name).to_numpy(zero_copy_only=False)
    y = np.asarray(table.column(target).to_pylist(), dtype=str) if target else None
    return x, y
