"""Reading a training file in blocks, for epochs streamed from disk (issue 48, item 2): the pieces
the streamed path is built from, each a function of the file, the seed and the epoch only.

- Blocks: a Parquet file's row groups; a plain CSV file's byte ranges, cut at line starts (a quoted
  cell holding a line break is refused, since a cut could fall inside it). Each block is read alone.
- Held-out rows: a row's split (train, validation, test) is decided by a hash of its position in the
  file and the seed (`split_codes`), so no pass is needed to split, and any reader of any block agrees.
- An epoch's order: the blocks permuted by the seed and the epoch, their rows mixed in a buffer of at
  most `buffer_rows` rows (`epoch_rows`).
The fitting passes (exact moments merged block by block: data/metrics.py's `Moments`), split over
the ranks, are `data/stream_fit.py`'s.
`data.stream` wires them to `train` (data/stream_prepare.py, training/stream_trainer.py); several
ranks read disjoint blocks and swap rows (distributed/stream_ranks.py); the encoded blocks are kept
for later passes in an unlinked temp file (data/stream_cache.py).
"""

from __future__ import annotations

import codecs
import contextlib
import queue
import threading
import io
import mmap
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .. import signals
from ..errors import DataError
from .arrow_csv import NULLS
from .columnar import BLOCK_BYTES as JSON_BLOCK_BYTES, _records as json_records, _text as json_text, batch_table, \
    columnar_format, open_source
from .csv_reader import CsvFormat, csv_header
from .table import ReadSpec, Table, checked_columns
from .text_source import DECOMPRESSORS, is_stream

try:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq
except ImportError:  # a dependency; BlockFile.of refuses through open_source / the CSV reader's message
    pa = None

BLOCK_BYTES = 1 << 26  # a CSV block's size (64 MiB of text)
TRAIN, VALIDATION, TEST = 0, 1, 2
SPLITS = (TRAIN, VALIDATION, TEST)


@dataclass(frozen=True)
class Block:
    """One piece of the file read alone: a Parquet row group (`lo` its index) or CSV bytes [lo, hi);
    `first_row`: the position in the file of its first data row (-1 until counted)."""
    lo: int
    hi: int
    first_row: int = -1
    rows: int = -1


# -- blocks --------------------------------------------------------------------------------------
@dataclass
class BlockFile:
    """A file read in blocks, with what every block's read needs worked out once (not per block): the
    CSV dialect and header (sniffed once), the column names, a JSON Lines file's types (inferred once
    from its first MiB, as its in-memory reader does). `reader()` opens the file once for a pass."""
    path: Path
    spec: ReadSpec
    kind: str  # csv | parquet | jsonl
    names: list[str]
    wanted: list[str]
    target: str | None
    fmt: CsvFormat | None = None
    schema: Any = None  # a JSON Lines file's pyarrow schema of the columns read

    @classmethod
    def of(cls, path: Path, spec: ReadSpec) -> "BlockFile":
        kind = columnar_format(path) or "csv"
        if is_stream(path) or path.suffix.lower() in DECOMPRESSORS or kind not in ("csv", "parquet", "jsonl"):
            raise DataError(f"{path}: streamed epochs read a plain CSV, JSON Lines or Parquet file in blocks; this "
                            "one cannot be cut into blocks. Decompress it, or convert it to Parquet, or set "
                            "data.stream: false")
        fmt = spec.csv_format(path) if kind == "csv" else None
        names = (list(fmt.names) if fmt.names else csv_header(path, fmt)) if fmt else _names(path, kind)
        wanted = checked_columns(path, names, spec)
        found = cls(path, spec, kind, names, wanted, spec.target if spec.target in names else None, fmt)
        found.schema = _json_schema(path, found.columns) if kind == "jsonl" else None
        return found

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(self.wanted + ([self.target] if self.target else [])))

    def blocks(self, block_bytes: int = BLOCK_BYTES) -> list[Block]:
        """Parquet row groups (counted), or byte ranges of lines (counted when read)."""
        if self.kind == "parquet":
            with _reading(self.path, "its footer (the row groups)"):
                meta = pq.ParquetFile(str(self.path)).metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
            return [Block(i, i + 1, int(s), n) for i, (s, n) in enumerate(zip(starts, counts))]
        with _reading(self.path, "its line starts"):
            return _line_ranges(self.path, bool(self.fmt and self.fmt.header), block_bytes)

    def reader(self) -> Callable[[Block, int], Table]:
        """`read(block, first_row)` for one pass: a Parquet file opened once for all its blocks."""
        if self.kind == "parquet":
            with _reading(self.path, "its footer"):
                opened = pq.ParquetFile(str(self.path))
            return lambda block, first: self._table(self._row_group(opened, block), first)
        return self._lines

    def release(self, block: Block) -> None:
        """Tell the kernel this run reads `block`'s bytes no more (its encoded rows are cached): their
        pages leave the page cache first. Read twice by the fitting passes, they would otherwise outrank
        the cache's pages, written once, and push out the very blocks every epoch reads (a 10 GB table's).
        The file is not changed; a page another process is writing is not dropped."""
        if not hasattr(os, "posix_fadvise"):
            return
        with contextlib.suppress(OSError, pa.ArrowException):  # advice only: a file moved or damaged since loses nothing
            lo, hi = self._spans[block.lo] if self.kind == "parquet" else (block.lo, block.hi)
            lo -= lo % mmap.PAGESIZE  # the page it shares with the block before too (whole pages are dropped)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, lo, max(0, hi - lo), os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    @cached_property
    def _spans(self) -> list[tuple[int, int]]:
        """Each Parquet row group's bytes in the file: (first, end), from the footer."""
        meta = pq.ParquetFile(str(self.path)).metadata
        spans = []
        for i in range(meta.num_row_groups):
            chunks = [meta.row_group(i).column(j) for j in range(meta.num_columns)]
            starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in chunks]
            spans.append((min(starts), max(a + c.total_compressed_size for a, c in zip(starts, chunks))))
        return spans

    def part(self, block: Block) -> str:
        """The block as its message names it: 'row group 3' or 'bytes 100-200'."""
        return f"row group {block.lo}" if self.kind == "parquet" else f"bytes {block.lo}-{block.hi}"

    def _row_group(self, opened: Any, block: Block) -> Any:
        with _reading(self.path, self.part(block)):
            return opened.read_row_group(block.lo, columns=self.columns)

    def _bytes(self, block: Block) -> bytes:
        with _reading(self.path, self.part(block)), open(self.path, "rb") as f:
            f.seek(block.lo)
            return f.read(block.hi - block.lo)

    def count(self, block: Block) -> int:
        """A block's rows without parsing it: its row group's count, or its non-empty lines (as a read
        counts them: a read whose rows differ is refused)."""
        return block.rows if block.rows >= 0 else _lines(self._bytes(block))

    def _table(self, table: Any, first_row: int) -> Table:
        fmt = self.fmt
        return batch_table(table, self.path, self.spec, self.wanted, self.target, first_row,
                           *((fmt.decimal, fmt.thousands) if fmt else ()))

    def _lines(self, block: Block, first_row: int) -> Table:
        data = self._bytes(block)
        try:
            table = self._csv(data) if self.fmt else self._json(data)
        except pa.ArrowInvalid as exc:
            raise DataError(_unsplittable(self.path, block, first_row, str(exc).strip())) from None
        if table.num_rows != _lines(data):  # a line break inside a quoted cell: a cut may fall in one
            raise DataError(_unsplittable(self.path, block, first_row, "a quoted cell holds a line break"))
        return self._table(table, first_row)

    def _csv(self, data: bytes) -> Any:
        fmt, columns = self.fmt, self.columns
        return pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(encoding=codecs.lookup(fmt.encoding).name, column_names=self.names),
            parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(include_columns=columns, null_values=NULLS, strings_can_be_null=True,
                                                 column_types={c: pa.string() for c in columns}))

    def _json(self, data: bytes) -> Any:
        """The block's records typed as the file's first MiB types them; a block where a value changes
        type is read as text cells, record by record (as the in-memory reader goes on)."""
        try:
            if self.schema is None:
                raise pa.ArrowInvalid("no types")
            return pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(block_size=max(1, len(data))),
                                    parse_options=pajson.ParseOptions(explicit_schema=self.schema,
                                                                      unexpected_field_behavior="ignore"))
        except pa.ArrowInvalid:
            records = [record for _, record in json_records(io.BytesIO(data), self.path)]
            where = f"{self.path} (a block)"
            return pa.table({c: pa.array([json_text(r.get(c), c, where) for r in records], pa.string())
                             for c in self.columns})


def _names(path: Path, kind: str) -> list[str]:
    """A Parquet file's column names from its footer, not memory-mapping the file (a map counts against
    ulimit -v: a file larger than the address space could not be streamed); others' by their reader."""
    if kind == "parquet" and pa is not None and path.is_file():
        try:
            names = list(pq.read_schema(str(path), memory_map=False).names)
        except (pa.ArrowException, OSError):
            return open_source(path).names  # its message, located
        if len(set(names)) == len(names):
            return names
    return open_source(path).names  # (refuses duplicate names, named)


def _json_schema(path: Path, columns: list[str]) -> Any:
    """The columns' types as pyarrow infers them from the file's first MiB (text where absent; None
    where pyarrow cannot type it)."""
    try:
        with open(path, "rb") as f:
            inferred = pajson.open_json(f, read_options=pajson.ReadOptions(block_size=JSON_BLOCK_BYTES)).schema
    except pa.ArrowInvalid:
        return None  # types that change within the first MiB: every block read as text cells
    return pa.schema([inferred.field(c) if c in inferred.names else pa.field(c, pa.string()) for c in columns])


def _line_ranges(path: Path, header: bool, block_bytes: int) -> list[Block]:
    """Byte ranges of about `block_bytes` after the header line, each ending at a line's end."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if header:
            f.readline()
        cuts = [f.tell()]
        while cuts[-1] < size:
            f.seek(min(size, cuts[-1] + block_bytes))
            f.readline()  # on to the next line's start
            cuts.append(min(size, f.tell()))
    return [Block(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def blocks_of(path: Path, spec: ReadSpec, block_bytes: int = BLOCK_BYTES) -> list[Block]:
    """The file's blocks (`BlockFile.blocks`)."""
    return BlockFile.of(path, spec).blocks(block_bytes)


def read_block(path: Path, spec: ReadSpec, block: Block, first_row: int) -> Table:
    """The block's rows as a Table, numbered from `first_row` (their positions in the file)."""
    return BlockFile.of(path, spec).reader()(block, first_row)


@contextlib.contextmanager
def _reading(path: Path, part: str) -> Iterator[None]:
    """An OSError while reading `part` of the file (a failing disk, the file removed or its rights
    changed mid-run) as a DataError naming the file, the part and the OS's reason, with the fix; the
    fitting passes raise it on every rank together."""
    try:
        yield
    except OSError as exc:
        signals.check()  # a stop signal that interrupted the read stops the run
        reason = exc.strerror or str(exc).strip() or type(exc).__name__
        raise DataError(f"{path}: {part} could not be read ({reason}); check the file is readable and the disk "
                        "healthy, then rerun") from None


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


def counted(file: BlockFile, blocks: list[Block]) -> Iterator[tuple[Block, Table]]:
    """Each block read in file order, with its first row and row count filled in."""
    at, read = 0, file.reader()
    for block in blocks:
        table = read(block, at)
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


def block_order(blocks: list[Block], seed: int, epoch: int) -> list[Block]:
    """The blocks in the order `epoch_rows` takes them in this epoch (so they can be read ahead)."""
    return [blocks[i] for i in np.random.default_rng([seed, epoch, 0x5EED]).permutation(len(blocks))]


# -- reading ahead ---------------------------------------------------------------------------------
PREFETCH_BLOCKS = 1  # blocks waiting, read and encoded ahead of the steps (one more in progress)
_END = object()


class Prefetcher:
    """`work(block)` done for the blocks of `order`, in order, by a background thread while the caller
    computes; at most `depth` results wait in a bounded queue. `get(block)` gives a block's result (its
    error raised in the caller's thread, as if done there); blocks before it that were never asked for
    are dropped (a resumed epoch skips some); a block not ahead gives None (the caller does it itself).
    Results are `work`'s alone, whatever the timing. `close()` stops the thread and waits for it."""

    def __init__(self, work: Callable[[Block], Any], order: list[Block], depth: int = PREFETCH_BLOCKS) -> None:
        self.ahead = {block: i for i, block in enumerate(order)}
        self.done = -1  # the position in `order` of the last result taken
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(work, order), name="magmadnn-read-ahead", daemon=True)
        self.thread.start()

    def _run(self, work: Callable[[Block], Any], order: list[Block]) -> None:
        for block in order:
            if self.stopping.is_set():
                return
            try:
                item = (block, work(block), None)
            except Exception as exc:  # noqa: BLE001  (any error: raised where the block is asked for)
                item = (block, None, exc)
            self.queue.put(item)
            if item[2] is not None:
                break
        self.queue.put((_END, None, None))

    def get(self, block: Block) -> Any:
        at = self.ahead.get(block, -1)
        if at <= self.done:
            return None
        while True:
            found, value, error = self.queue.get()
            if found is _END:
                self.done = len(self.ahead)
                return None
            self.done = self.ahead[found]
            if found == block:
                if error is not None:
                    raise error
                return value
            if error is not None:  # a block passed over failed, and the thread stopped there
                self.done = len(self.ahead)
                return None

    def close(self) -> None:
        """Stop reading ahead: the thread ends after its current block (its queue emptied so it can)."""
        self.stopping.set()
        while self.thread.is_alive():
            try:
                self.queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self.thread.join()


def prefetched(work: Callable[[Block], Any], order: list[Block], depth: int = PREFETCH_BLOCKS) -> Iterator[Any]:
    """`work(block)` for each block of `order`, done ahead in a background thread; stopped when the
    loop ends, early or on an error."""
    ahead = Prefetcher(work, order, depth)
    try:
        for block in order:
            found = ahead.get(block)
            yield found if found is not None else work(block)
    finally:
        ahead.close()
