"""Parquet, Feather / Arrow IPC and JSON Lines (also .gz, .bz2, .xz) through pyarrow, read in record
batches (so `predict` streams a file of any size). Typed columns keep their types: numbers are
numbers, nulls (and NaN) missing cells, strings text that the CSV inference types (categories,
booleans, numbers written as text), booleans true/false, dates ISO text. The columns are checked
and named as in CSV. A JSON Lines file whose keys change type or appear late (which pyarrow's
typed reader refuses) is read on by a line reader, with file:line messages."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .. import signals
from ..config import names as config_names
from ..core import backend as B
from . import dates
from ..errors import DataError
from .cells import RawColumns, refuse_duplicate_names
from .text_source import DECOMPRESSORS, READ_ERRORS, check_file
from .csv_reader import text_too_large
from .numbers import typed_cells
from .table import ReadSpec, Table, checked_columns, joined, whole_read

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pajson
    import pyarrow.parquet as pq
except ImportError:  # a dependency; only these formats need it
    pa = None

PACKED = ("", *config_names.PACKED)  # a name as it is, or compressed
SUFFIXES = {kind: config_names.FORMATS[kind].names() for kind in ("parquet", "feather", "jsonl")}  # as declared


def columnar_format(path: Path) -> str | None:
    """parquet, feather or jsonl by the file's suffix; None for other files."""
    return next((kind for kind in SUFFIXES if config_names.FORMATS[kind].matches(path)), None)


@dataclass
class Source:
    """An opened file: its column names and its rows of some columns, in batches of at most n rows."""
    names: list[str]
    batches: Callable[[list[str], int], Iterator["pa.RecordBatch"]]


def sliced(batches: Iterable[Any], rows: int) -> Iterator[Any]:
    """Record batches cut into pieces of at most `rows` rows (zero-copy slices)."""
    for batch in batches:
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


def _unmapped(path: Path) -> "pa.NativeFile":
    """The file opened for reads into memory, not memory-mapped: a map of the whole file counts
    against `ulimit -v`, so a file larger than the address space could not be read even in batches."""
    return pa.OSFile(str(path), "rb")


def _parquet(path: Path) -> Source:
    """Row groups read as the batches are asked for (pre_buffer, pyarrow's default, reads every row
    group asked for up front: the whole file, in memory, before the first batch)."""
    f = pq.ParquetFile(_unmapped(path), memory_map=False, pre_buffer=False)
    return Source(list(f.schema_arrow.names), lambda columns, rows: f.iter_batches(batch_size=rows, columns=columns))


def _feather(path: Path) -> Source:
    """Feather version 2 is the Arrow IPC file format; the IPC stream format is taken too."""
    try:
        reader = pa.ipc.open_file(_unmapped(path))
        parts: Callable[[], Iterator[Any]] = lambda: (reader.get_batch(i) for i in range(reader.num_record_batches))  # noqa: E731
    except pa.ArrowInvalid:
        try:
            stream = pa.ipc.open_stream(_unmapped(path))
        except pa.ArrowInvalid:
            raise DataError(f"{path}: not an Arrow IPC or Feather (version 2) file; a Feather version 1 file can be "
                            "rewritten with pyarrow.feather.write_feather(pyarrow.feather.read_table(path), path)")
        reader, parts = stream, lambda: iter(stream)

    return Source(list(reader.schema.names), lambda columns, rows: sliced((b.select(columns) for b in parts()), rows))


# -- JSON Lines ----------------------------------------------------------------------------------
BLOCK_BYTES = 1 << 20  # pyarrow infers a JSON Lines file's types from its first block


def _binary(path: Path) -> Any:
    opener = DECOMPRESSORS.get(path.suffix.lower())
    return opener(path, "rb") if opener else open(path, "rb")


def _jsonl(path: Path) -> Source:
    names: dict[str, None] = {}
    with _binary(path) as f:
        for number, record in _records(f, path, limit=BLOCK_BYTES):
            names.update(dict.fromkeys(record))
    if not names:
        raise DataError(f"{path}: no JSON records; expected one JSON object per line")
    return Source(_later_keys(path, list(names)), lambda columns, rows: _json_batches(path, columns, rows))


def _later_keys(path: Path, names: list[str]) -> list[str]:
    """`names` (the first block's keys) and the keys that first appear after it, in order of first
    appearance: pyarrow's reader, held to the first block's schema, reads the file through (C++) unless
    a record has another key (or another type); then every record's keys are read (Python)."""
    try:
        with _binary(path) as f:
            schema = pajson.open_json(f, read_options=pajson.ReadOptions(block_size=BLOCK_BYTES)).schema
        if sorted(schema.names) == sorted(names):
            parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
            with _binary(path) as f:
                for _ in pajson.open_json(f, read_options=pajson.ReadOptions(block_size=BLOCK_BYTES),
                                          parse_options=parse):
                    signals.check()
                return names
    except (pa.ArrowInvalid, *READ_ERRORS):
        signals.check()
    found = dict.fromkeys(names)
    with _binary(path) as f:
        for _, record in _records(f, path):
            found.update(dict.fromkeys(record))
    return list(found)


def _records(f: Any, path: Path, start: int = 0, limit: int | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line after the first `start` records; `limit`: stop
    after about that many bytes."""
    seen, size = 0, 0
    for number, line in enumerate(f, 1):
        size += len(line)
        if not line.strip():
            continue
        seen += 1
        if seen > start:
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}:{number}: not JSON ({exc}); expected one JSON object per line") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{number}: a JSON {type(record).__name__}, not an object; expected one "
                                "JSON object ({\"column\": value, ...}) per line")
            yield number, record
        if limit is not None and size >= limit:
            return


def _json_batches(path: Path, columns: list[str], rows: int) -> Iterator[Any]:
    """Typed batches from pyarrow; from the first record it refuses (a key whose type changes, one
    the first block did not have, a value beyond float64), text batches from the line reader."""
    done = 0
    try:
        for part in sliced(_typed_json(path, columns), rows):
            yield part
            done += part.num_rows
    except (pa.ArrowInvalid, *READ_ERRORS):
        signals.check()
    else:
        return
    with _binary(path) as f:
        records = _records(f, path, start=done)
        while chunk := [numbered for _, numbered in zip(range(rows), records)]:
            yield pa.RecordBatch.from_arrays([pa.array([_text(r.get(c), c, f"{path}:{n}") for n, r in chunk],
                                                       pa.string()) for c in columns], names=columns)


def _typed_json(path: Path, columns: list[str]) -> Iterator[Any]:
    options = pajson.ReadOptions(block_size=BLOCK_BYTES)
    with _binary(path) as f:
        inferred = pajson.open_json(f, read_options=options).schema
    fields = [inferred.field(c) if c in inferred.names else pa.field(c, pa.string()) for c in columns]
    parse = pajson.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore")
    with _binary(path) as f:
        yield from pajson.open_json(f, read_options=options, parse_options=parse)


def _text(value: Any, column: str, where: str) -> str | None:
    """A JSON value as a CSV cell would hold it (None: missing)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    raise DataError(f"{where}: column {column!r} holds a JSON {type(value).__name__} ({json.dumps(value)[:40]}); "
                    f"magmadnn reads flat columns: flatten it, or leave it out (data.columns.{column}: ignore)")


# -- batches as tables ---------------------------------------------------------------------------
def _is_number(kind: Any) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind) \
        or pa.types.is_null(kind)


def _as_numbers(column: Any, plain: bool) -> np.ndarray | None:
    """A number column, or a text column whose every cell pyarrow reads as a plain number, as
    float64 (null: NaN); None for the others (the text path types them)."""
    if not _is_number(column.type) and not (plain and pa.types.is_string(column.type)):
        return None
    try:
        if pa.types.is_string(column.type):
            column.slice(0, 64).cast(pa.float64())  # text fails here, before a pass over every cell
        typed = column if column.type == pa.float64() else column.cast(pa.float64())
        return typed.to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        return None


def _distinct(column: Any, name: str, path: Path, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A column as (its distinct values as text, then '' for null; each row's index into them):
    numbers in their shortest form; a Python string per distinct value, not per row. Timestamps
    beyond the dates magmadnn reads, and cells too long to hold as text, are refused by row."""
    kind = column.type
    if pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        raise DataError(f"{path}: column {name!r} holds {kind} values; magmadnn reads flat columns (numbers, text, "
                        f"booleans, dates): flatten it, or leave it out (data.columns.{name}: ignore)")
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        _check_dates(column, name, path, start)
    encoded = column.cast(pa.string()).dictionary_encode()
    encoded = encoded.combine_chunks() if isinstance(encoded, pa.ChunkedArray) else encoded
    indices = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy(zero_copy_only=False)
    _check_width(encoded.dictionary, indices, name, path, start)
    values = np.asarray(encoded.dictionary.to_pylist() + [""], dtype=str)
    return values, indices


def _check_width(dictionary: Any, indices: np.ndarray, name: str, path: Path, start: int) -> None:
    """Text cells are held as wide as the column's longest (4 bytes a character, a cell per row): a
    column whose rows would take too much memory so (`text_too_large`) is refused, naming its longest
    cell, before any is held (a 100 MB cell in a column of 50 rows took 20 GB)."""
    if not len(dictionary):
        return
    lengths = pc.utf8_length(dictionary)
    longest = pc.max(lengths).as_py() or 0
    need = 4 * longest * (len(indices) + len(dictionary) + 1)
    if (why := text_too_large(need, longest, name)) is None:
        return
    row = start + int(np.flatnonzero(indices == pc.index(lengths, longest).as_py())[0]) + 1
    raise DataError(f"{path}: column {name!r}, data row {row}: a cell of {longest:,} characters; held as text, the "
                    f"column's {len(indices):,} rows would take {B.gib(need)}, {why}")


UNITS = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}  # ticks a second, by timestamp unit
FIRST, LAST = (dates.datetime(1, 1, 1) - dates.EPOCH).total_seconds(), \
    (dates.datetime(9999, 12, 31, 23, 59, 59) - dates.EPOCH).total_seconds()


def _check_dates(column: Any, name: str, path: Path, start: int) -> None:
    """Timestamps and dates within the years 1 to 9999, the dates a cell can hold (pyarrow writes the
    others as '<value out of range: ...>', which would be trained as a category)."""
    kind = column.type
    per_second = UNITS[kind.unit] if pa.types.is_timestamp(kind) else 1 / dates.DAY if kind == pa.date32() else 10**3
    ticks = column.cast(pa.int32() if kind == pa.date32() else pa.int64())  # pyarrow casts date32 to int32 only
    ticks = ticks.to_numpy(zero_copy_only=False).astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = (ticks / per_second < FIRST) | (ticks / per_second > LAST)
    if bad.any():
        row = int(np.argmax(bad))
        unit = f"{kind.unit}" if pa.types.is_timestamp(kind) else "days" if kind == pa.date32() else "ms"
        raise DataError(f"{path}: column {name!r} ({kind}), data row {start + row + 1}: the value {int(ticks[row]):,} "
                        f"({unit} since 1970-01-01) is outside the dates magmadnn reads (the years 1 to 9999); "
                        f"{int(bad.sum())} row(s) hold such values: fix them, or leave the column out "
                        f"(data.columns.{name}: ignore)")


def _texts(column: Any, name: str, path: Path, start: int = 0) -> np.ndarray:
    """A column as text cells (numbers in their shortest form, nulls '')."""
    values, rows = _distinct(column, name, path, start)
    return values[rows]


def batch_table(batch: Any, path: Path, spec: ReadSpec, wanted: list[str], target: str | None, start: int = 0,
                decimal: str = ".", thousands: str = "") -> Table:
    """One batch (or table) as a Table: number columns as floats (null and NaN missing), the others
    as text typed as CSV cells are (numbers written as text, in this decimal and thousands style,
    are numbers)."""
    dtype = spec.dtype or B.current().floatx
    declared = spec.text_columns(wanted)
    x = np.full((batch.num_rows, len(wanted)), np.nan, dtype)
    strings = {}
    for j, name in enumerate(wanted):
        column = batch.column(name)
        if j not in declared and (numbers := _as_numbers(column, decimal == "." and not thousands)) is not None:
            with np.errstate(over="ignore"):  # beyond the float type: inf, refused by cell with the others
                x[:, j] = numbers
            continue
        values, rows = _distinct(column, name, path, start)  # typed once per distinct value, as CSV cells are
        numbers, text = typed_cells(values[:, None], dtype, {0} if j in declared else set(), decimal, thousands)
        if text:
            strings[j] = text[0][rows]
        else:
            x[:, j] = numbers[rows, 0]
    y = _texts(batch.column(target), target, path, start) if target else None
    kept = {k: _texts(batch.column(k), k, path, start) for k in spec.keep}
    return spec.blanked(Table(RawColumns(x, strings, np.arange(start, start + batch.num_rows)), y, wanted, str(path),
                              kept))


OPENERS = {"parquet": _parquet, "feather": _feather, "jsonl": _jsonl}


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """pyarrow's and the file system's errors as one located message."""
    try:
        yield
    except pa.ArrowCancelled as exc:  # SIGINT/SIGTERM stopped the read
        raise KeyboardInterrupt from exc
    except (pa.ArrowException, *READ_ERRORS, io.UnsupportedOperation) as exc:
        signals.check()
        kind = columnar_format(path)
        raise DataError(f"{path}: cannot read it as {kind} ({str(exc).strip() or type(exc).__name__}); is it a "
                        f"{kind} file? the format is chosen by the file's suffix") from None


def open_source(path: Path) -> Source:
    check_file(path)
    if pa is None:
        raise DataError(f"{path}: reading {columnar_format(path)} needs pyarrow: pip install pyarrow")
    with _reading(path):
        source = OPENERS[columnar_format(path)](path)
    refuse_duplicate_names(path, source.names, "the schema", "rename them in the file (pyarrow: "
                           "table.rename_columns([...]))")
    return source


def column_names(path: Path, spec: ReadSpec) -> list[str]:
    return open_source(path).names


def columnar_chunks(path: Path, spec: ReadSpec, chunk_rows: int = 65536, whole: bool = False) -> Iterator[Table]:
    """The file's rows as Tables of at most `chunk_rows` rows; `whole`: the caller keeps them all,
    so their rows are counted against the memory budget as they arrive."""
    source = open_source(path)
    wanted = checked_columns(path, source.names, spec)
    target = spec.target if spec.target in source.names else None
    columns = list(dict.fromkeys(wanted + ([target] if target else []) + list(spec.keep)))
    bound = whole_read(path, spec, len(wanted)) if whole else None
    done = 0
    with _reading(path):
        for batch in source.batches(columns, chunk_rows):
            if bound is not None:
                bound.add(batch.nbytes, batch.num_rows)
            yield batch_table(batch, path, spec, wanted, target, done)
            done += batch.num_rows


WHOLE_ROWS = 1 << 18  # rows per batch of a whole read (fewer, larger pieces to join)


def read_columnar(path: Path, spec: ReadSpec) -> Table:
    return joined(list(columnar_chunks(path, spec, WHOLE_ROWS, whole=True)), spec, path)
