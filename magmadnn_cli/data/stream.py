"""Reading a training file in blocks, for epochs streamed from disk (issue 48, item 2): the pieces
the streamed path is built from, each a function of the file, the seed and the epoch only.

- Blocks: a Parquet file's row groups; a plain CSV file's byte ranges, cut at line starts (a quoted
  cell holding a line break is refused, since a cut could fall inside it). Each block is read alone.
- Held-out rows: a row's split (train, validation, test) is decided by a hash of its position in the
  file and the seed (`split_codes`), so no pass is needed to split, and any reader of any block agrees.
- An epoch's order: the blocks permuted by the seed and the epoch, their rows mixed in a buffer of at
  most `buffer_rows` rows (`epoch_rows`).
The fitting passes (exact moments merged block by block: data/metrics.py's `Moments`) are
`data/stream_prepare.py`'s.
`data.stream` wires them to `train` (data/stream_prepare.py, training/stream_trainer.py); the ranks'
disjoint blocks are still to come.
"""

from __future__ import annotations

import codecs
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import DataError
from .arrow_csv import NULLS
from .columnar import batch_table, columnar_format, open_source
from .csv_reader import csv_header
from .table import ReadSpec, Table, checked_columns
from .text_source import DECOMPRESSORS, is_stream

BLOCK_BYTES = 1 << 26  # a CSV block's size (64 MiB of text)
TRAIN, VALIDATION, TEST = 0, 1, 2


@dataclass(frozen=True)
class Block:
    """One piece of the file read alone: a Parquet row group (`lo` its index) or CSV bytes [lo, hi);
    `first_row`: the position in the file of its first data row (-1 until counted)."""
    lo: int
    hi: int
    first_row: int = -1
    rows: int = -1


# -- blocks --------------------------------------------------------------------------------------
def blocks_of(path: Path, spec: ReadSpec, block_bytes: int = BLOCK_BYTES) -> list[Block]:
    """The file's blocks: Parquet row groups (counted), or CSV byte ranges (counted when read)."""
    if columnar_format(path) == "parquet":
        open_source(path)  # checks the file and its column names
        import pyarrow.parquet as pq  # lazily: pyarrow is needed for these formats only
        f = pq.ParquetFile(str(path))
        counts = [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
        return [Block(i, i + 1, int(s), n) for i, (s, n) in enumerate(zip(starts, counts))]
    if is_stream(path) or path.suffix.lower() in DECOMPRESSORS or columnar_format(path) is not None:
        raise DataError(f"{path}: streamed epochs read a plain CSV or a Parquet file in blocks; this one cannot be "
                        "cut into blocks. Decompress it, or convert it to Parquet, or set data.stream: false")
    return _csv_ranges(path, spec, block_bytes)


def _csv_ranges(path: Path, spec: ReadSpec, block_bytes: int) -> list[Block]:
    """Byte ranges of about `block_bytes` after the header line, each ending at a line's end."""
    fmt = spec.csv_format(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if fmt.header:
            f.readline()
        cuts = [f.tell()]
        while cuts[-1] < size:
            f.seek(min(size, cuts[-1] + block_bytes))
            f.readline()  # on to the next line's start
            cuts.append(min(size, f.tell()))
    return [Block(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def read_block(path: Path, spec: ReadSpec, block: Block, first_row: int) -> Table:
    """The block's rows as a Table, numbered from `first_row` (their positions in the file)."""
    if columnar_format(path) == "parquet":
        import pyarrow.parquet as pq
        source = open_source(path)
        wanted = checked_columns(path, source.names, spec)
        target = spec.target if spec.target in source.names else None
        columns = list(dict.fromkeys(wanted + ([target] if target else [])))
        group = pq.ParquetFile(str(path)).read_row_group(block.lo, columns=columns)
        return batch_table(group, path, spec, wanted, target, first_row)
    return _csv_block(path, spec, block, first_row)


def _csv_block(path: Path, spec: ReadSpec, block: Block, first_row: int) -> Table:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    fmt = spec.csv_format(path)
    names = list(fmt.names) if fmt.names else csv_header(path, fmt)
    wanted = checked_columns(path, names, spec)
    target = spec.target if spec.target in names else None
    with open(path, "rb") as f:
        f.seek(block.lo)
        data = f.read(block.hi - block.lo)
    columns = list(dict.fromkeys(wanted + ([target] if target else [])))
    try:
        table = pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(encoding=codecs.lookup(fmt.encoding).name, column_names=names),
            parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(include_columns=columns, null_values=NULLS, strings_can_be_null=True,
                                                 column_types={c: pa.string() for c in columns}))
    except pa.ArrowInvalid as exc:
        raise DataError(_unsplittable(path, block, first_row, str(exc))) from None
    if table.num_rows != _lines(data):  # a line break inside a quoted cell: a cut may fall in one
        raise DataError(_unsplittable(path, block, first_row, "a quoted cell holds a line break"))
    return batch_table(table, path, spec, wanted, target, first_row, fmt.decimal, fmt.thousands)


def _unsplittable(path: Path, block: Block, first_row: int, why: str) -> str:
    return (f"{path}: bytes {block.lo}-{block.hi} (data rows from {first_row + 1}) cannot be read as a block: "
            f"{why}. A file with a quoted cell with a line break cannot be streamed: convert it to Parquet, or set "
            "data.stream: false")


def _lines(data: bytes) -> int:
    """Non-empty lines in `data` (as pyarrow counts rows: blank lines skipped; \n or \r\n ends)."""
    text = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(text == 10)
    before = ends - 1 - (text[np.maximum(ends - 1, 0)] == 13)  # the last byte of the line's text
    blank = (before < 0) | (text[np.maximum(before, 0)] == 10)
    tail = data[(int(ends[-1]) + 1 if len(ends) else 0):].strip(b"\r")  # a last line without its line break
    return int(len(ends) - blank.sum()) + bool(tail)


def counted(path: Path, spec: ReadSpec, blocks: list[Block]) -> Iterator[tuple[Block, Table]]:
    """Each block read in file order, with its first row and row count filled in."""
    at = 0
    for block in blocks:
        table = read_block(path, spec, block, at)
        rows = len(table.raw.x)
        yield Block(block.lo, block.hi, at, rows), table
        at += rows


# -- held-out rows -------------------------------------------------------------------------------
def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: uint64 -> well-mixed uint64."""
    z = values.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_hash(positions: np.ndarray, seed: int, salt: int = 0) -> np.ndarray:
    """A uniform number in [0, 1) per row position, a function of the position, seed and salt only."""
    with np.errstate(over="ignore"):
        key = _mix(np.asarray(positions, np.uint64) + _mix(np.array([seed * 2 + 1 + salt * 7919], np.uint64)))
    return (key >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def split_codes(positions: np.ndarray, seed: int, validation: float, test: float) -> np.ndarray:
    """Each row's split: TEST when its hash falls below `test`, VALIDATION below `test + validation`,
    else TRAIN. Shares are those fractions in expectation (not exactly, unlike the in-memory split)."""
    u = row_hash(positions, seed)
    return np.where(u < test, TEST, np.where(u < test + validation, VALIDATION, TRAIN)).astype(np.int8)


# -- an epoch's order ------------------------------------------------------------------------------
def epoch_rows(blocks: list[Block], seed: int, epoch: int, buffer_rows: int,
               read: Callable[[Block], tuple[np.ndarray, ...]]) -> Iterator[tuple[np.ndarray, ...]]:
    """The epoch's rows, in pieces: blocks in an order drawn from (seed, epoch); `read(block)` gives
    arrays of its kept rows (the first, their positions), mixed in a buffer: each time it holds
    `buffer_rows` rows, it is shuffled and half given out. At most `buffer_rows` plus one block's
    rows are held."""
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    held: tuple[np.ndarray, ...] | None = None
    for i in rng.permutation(len(blocks)):
        new = read(blocks[i])
        held = new if held is None else tuple(np.concatenate([a, b]) for a, b in zip(held, new))
        while len(held[0]) >= buffer_rows:
            mixed = rng.permutation(len(held[0]))
            held = tuple(a[mixed] for a in held)
            keep = buffer_rows // 2
            yield tuple(a[keep:] for a in held)
            held = tuple(a[:keep] for a in held)
    if held is not None and len(held[0]):
        mixed = rng.permutation(len(held[0]))
        yield tuple(a[mixed] for a in held)
