"""Streamed epochs wired to `train` (issue 48, item 2; `data.stream`): the file is never held whole.

Two bounded passes over the blocks (data/stream.py; data/stream_fit.py, split over the ranks) fit
what `prepare` fits on the training rows:
1. a survey: every row's split by the hash rule, the labels of all rows, each text column's values
   over the training rows, and a uniform sample of `SAMPLE_ROWS` training rows (bottom-k by hash);
   the column encoder is fitted on the sample (types, fills: medians of the sample) and its
   categories widened to every value the training rows hold;
2. the encoded training rows' exact moments (and range): the normalizer; the targets of each split
   (one small value a row) are kept, the features are not.
Each epoch then reads the blocks in the seed and epoch's order (`StreamSource.epoch`), and
evaluation reads a split's rows in file order (`InOrder`, which a `Split` holds in place of an array).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from ..config.data import DataConfig
from ..core import backend as B
from ..errors import DataError
from . import stream
from .columns import ColumnEncoder
from .fitting import fit
from .normalize import Normalizer, TargetScaler
from .prepare import Prepared, Split, encode_features, map_labels
from .stream_cache import EncodedBlocks, JoinedBlocks, encoded_blocks
from .stream_fit import SAMPLE_ROWS, FitRanks, Survey, compact, fitted_normalizer, joined_caches, survey, widened
from .table import ReadSpec, Table, typed_labels
from .targets import table_task, target_task

BUFFER_ROWS = 1 << 16  # rows an epoch's shuffle mixes at a time
SPLIT_CODES = {"train": stream.TRAIN, "validation": stream.VALIDATION, "test": stream.TEST}
T = TypeVar("T")


@dataclass
class StreamSource:
    """The training file read block by block, with what was fitted on its training rows. A pass over
    the blocks (an epoch, an evaluation) reads the next blocks ahead in a background thread (`ahead`);
    the file is opened once per pass (`stream.BlockFile.reader`)."""
    path: Path
    spec: ReadSpec
    cfg: DataConfig
    blocks: list[stream.Block]
    seed: int
    encoder: ColumnEncoder
    normalizer: Normalizer
    classes: list[Any]
    task: str
    buffer_rows: int = BUFFER_ROWS
    targets: TargetScaler = field(default_factory=TargetScaler)  # regression targets' scaling
    file: stream.BlockFile | None = None  # None: worked out from path and spec
    cache: EncodedBlocks | JoinedBlocks | None = None  # each block's encoded rows, kept by the fitting pass
    _read: Any = field(default=None, repr=False)  # this pass's reader (the caller's thread)
    _ahead: tuple[int, stream.Prefetcher] | None = field(default=None, repr=False)  # (split code, reader ahead)
    _hints: tuple[int, list, dict, list] | None = field(default=None, repr=False)  # (code, order, at, [asked])

    def __post_init__(self) -> None:
        self.file = self.file or stream.BlockFile.of(self.path, self.spec)

    def codes(self, block: stream.Block) -> np.ndarray:
        positions = np.arange(block.first_row, block.first_row + block.rows)
        return stream.split_codes(positions, self.seed, self.cfg.validation_split, self.cfg.test_split)

    def encoded(self, block: stream.Block, code: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The block's rows of one split: (their positions in the file, encoded features, targets);
        taken from the reader ahead when it reads this split's blocks."""
        if self._ahead is not None and self._ahead[0] == code:
            found = self._ahead[1].get(block)
            if found is not None:
                return found
        self._hint(block, code)
        self._read = self._read or self.file.reader()
        return self._encoded(self._read, block, code)

    def _encoded(self, read: Any, block: stream.Block, code: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keep = np.flatnonzero(self.codes(block) == code)
        cached = self.cache.get((block, code)) if self.cache is not None else None
        if cached is not None:  # the split's rows as the fitting pass encoded them (row by row: the same)
            x, y = cached
        else:
            table = read(block, block.first_row)
            part = Table(table.raw.rows(keep), table.y[keep], table.features, table.source)
            x, _ = encode_features(part, self.encoder)
            y = target_task(self.task).encode(map_labels(part.y, self.cfg.label_map), self.classes, table.source,
                                              part.raw)
        return block.first_row + keep, self.normalizer(x, own=True), compact(self.targets(y), len(self.classes))

    def ahead(self, order: list[stream.Block], code: int) -> None:
        """A new pass: the file reopened, and `order`'s blocks (those this process reads next, in the
        order it reads them) read and encoded for split `code` in a background thread, unless the
        cache holds them: a cached block is one copy from the page cache, cheaper than what the
        thread's hand-offs cost the steps (docs/performance.md, streamed epochs); the kernel is asked
        for each next cached block's bytes instead (a cache larger than the page cache is read from disk)."""
        self.close()
        if self.cache is not None and all((block, code) in self.cache.entries for block in order):
            self._hints = (code, order, {block: i for i, block in enumerate(order)}, [0])
            return
        read = self.file.reader()
        self._ahead = (code, stream.Prefetcher(lambda block: self._encoded(read, block, code), order))

    def _hint(self, block: stream.Block, code: int) -> None:
        """Before a cached block of this pass is read: the kernel asked for the bytes of the pass's
        blocks up to the next one (read in the background while this one is used)."""
        if self._hints is None or self._hints[0] != code or block not in self._hints[2]:
            return
        _, order, at, asked = self._hints
        for i in range(asked[0], min(at[block] + 2, len(order))):
            self.cache.will_need((order[i], code))
        asked[0] = max(asked[0], at[block] + 2)

    def close(self) -> None:
        """End the pass: the reader ahead stopped, the file closed."""
        if self._ahead is not None:
            self._ahead[1].close()
        self._ahead, self._read, self._hints = None, None, None

    def in_file_order(self, code: int, first: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Split `code`'s rows (x, y) block by block in file order, from block `first` on."""
        self.ahead(self.blocks[first:], code)
        try:
            for block in self.blocks[first:]:
                _, x, y = self.encoded(block, code)
                yield x, y
        finally:
            self.close()

    def epoch(self, epoch: int, shuffle: bool) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The epoch's training rows (positions, x, y) in pieces: blocks permuted by (seed, epoch) and
        rows mixed in a buffer (`stream.epoch_rows`); in file order with training.shuffle false."""
        self.ahead(stream.block_order(self.blocks, self.seed, epoch) if shuffle else self.blocks, stream.TRAIN)
        read = lambda block: self.encoded(block, stream.TRAIN)  # noqa: E731
        try:
            yield from (stream.epoch_rows(self.blocks, self.seed, epoch, self.buffer_rows, read) if shuffle
                        else (read(block) for block in self.blocks))
        finally:
            self.close()


class InOrder:
    """A split's encoded rows, read from the file in order as evaluation asks for them (slices in
    increasing order: one block and one batch held), from the block holding the first row asked for
    (a rank's share of the rows reads the blocks of its share). Anything needing the rows at once is
    refused."""

    def __init__(self, source: StreamSource, code: int, rows: int, width: int, dtype: np.dtype) -> None:
        self.source, self.code = source, code
        self.shape, self.dtype, self.ndim = (rows, width), dtype, 2
        self._pieces: Iterator[tuple[np.ndarray, np.ndarray]] | None = None
        self._held, self._start = np.empty((0, width), dtype), 0
        self._firsts: np.ndarray | None = None  # the split's row at each block's start (by the hash rule)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, part: Any) -> np.ndarray:
        if not isinstance(part, slice) or part.step not in (None, 1):
            self.__array__()
        return within_memory(self.source.cfg, True, "reading the held-out rows", lambda: self._rows(part))

    def _rows(self, part: slice) -> np.ndarray:
        start, stop, _ = part.indices(len(self))
        if self._pieces is None or start < self._start or start >= self._start + len(self._held) + BUFFER_ROWS:
            first, self._start = self._block_of(start)
            self._pieces, self._held = self.source.in_file_order(self.code, first), self._held[:0]
        while self._start + len(self._held) < stop:
            self._held = np.concatenate([self._held, next(self._pieces)[0]])
        self._held, self._start = self._held[start - self._start:], start
        return self._held[:stop - start]

    def _block_of(self, row: int) -> tuple[int, int]:
        """The block holding the split's row `row` (the last block for the end), and its first row
        of the split (counted by the hash rule, without reading, once)."""
        if row == 0:
            return 0, 0
        if self._firsts is None:
            counts = [np.count_nonzero(self.source.codes(block) == self.code) for block in self.source.blocks]
            self._firsts = np.concatenate([[0], np.cumsum(counts)])
        block = max(0, min(int(np.searchsorted(self._firsts, row, side="right")) - 1, len(self.source.blocks) - 1))
        return block, int(self._firsts[block])

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise DataError(f"{self.source.path}: with data.stream, the rows are read block by block and never held "
                        "at once; this needs them all (a checkpoint's data check, --resume): set data.stream: false")


def prepare_streamed(cfg: DataConfig, task: str, seed: int, block_bytes: int | None = None,
                     ranks: FitRanks = FitRanks()) -> Prepared:
    """`prepare`'s result for a streamed run: the encoder, classes and normalizer fitted in two bounded
    passes (on N `ranks`, each reads its share of the blocks: data/stream_fit.py); each split a
    `Split` of `InOrder` rows and its targets."""
    path, spec = Path(cfg.train), ReadSpec.of(cfg)
    labelled = target_task(task).decl.labels
    ranks = ranks.guarded(lambda make: within_memory(cfg, True, "reading and encoding the data", make))
    found = survey(path, spec, cfg, seed, block_bytes or stream.BLOCK_BYTES, labelled, ranks=ranks)
    encoder, notes, classes, task = ranks.together(lambda: _fitted(found, cfg, task, labelled))
    source = StreamSource(path, spec, cfg, found.blocks, seed, encoder, Normalizer(), classes, task, BUFFER_ROWS,
                          file=found.file)
    width = encoder.width or len(found.features)
    mine = sum(found.blocks[i].rows for i in ranks.mine(len(found.blocks)))
    source.cache = encoded_blocks(mine * (width * np.dtype(B.current().floatx).itemsize + 8))
    source.normalizer, targets = ranks.together(lambda: fitted_normalizer(source, cfg, width, ranks))
    source.cache = joined_caches(source.cache, ranks)
    if not labelled and cfg.target_normalize != "none":  # as `prepare` scales them: the training targets' moments
        source.targets = TargetScaler.fit(targets[stream.TRAIN], found.source)
    splits = {name: Split(InOrder(source, code, int(found.rows[code]), width, source.normalizer.shift.dtype),
                          source.targets(targets[code])) if found.rows[code] else None
              for name, code in SPLIT_CODES.items()}
    notes += [f"{found.source}: streamed in {len(found.blocks)} blocks (data.stream): "
              f"{found.rows[0]:,} training, {found.rows[1]:,} validation and {found.rows[2]:,} test rows, held out by a "
              "hash of each row's position and the seed; column types and fills fitted on a sample of "
              f"{min(SAMPLE_ROWS, int(found.rows[0])):,} training rows"]
    return Prepared(splits["train"], splits["validation"], splits["test"], classes, found.features, (width,),
                    source.normalizer, found.source, encoder, source.targets, notes, {}, task)


def _fitted(found: Survey, cfg: DataConfig, task: str, labelled: bool) -> tuple[ColumnEncoder, list[str], list, str]:
    """The column encoder (fitted on the sample, its categories widened), its notes, the classes and the task."""
    if found.sample is None or not len(found.sample.x):
        raise DataError(f"{cfg.train}: no training rows left after the validation/test split")
    cells = typed_labels(np.array(sorted(found.labels)))
    task = table_task(task, cells) if labelled else task  # label sets make a binary loss's task multi-label
    classes = target_task(task).labels(cells, found.source)
    encoder, notes = fit(found.sample, found.features, cfg, found.source)
    return widened(encoder, found), notes, classes, task


def streaming(config: Any, ranks: int, fold: tuple[int, int] | None, stale_gradients: bool = False) -> bool:
    """Whether this run streams (data.stream, auto resolved by the file's size), refusing, named,
    what streamed runs do not support yet (`stale_gradients`: the strategy's fact, asynchronous SGD)."""
    data = config.data
    wanted = data.stream
    if wanted == "auto":
        wanted = bool(data.train and over_budget(Path(data.train)))
    if not wanted:
        return False
    problem = _unsupported(config, ranks, fold, stale_gradients)
    if problem:
        raise DataError(f"data.stream: {data.stream}: {problem}; set data.stream: false to read the data into memory")
    return True


def over_budget(path: Path) -> bool:
    """data.stream: auto's rule: the file is larger than half the memory available."""
    available = B.host_memory_available()
    return path.is_file() and available is not None and path.stat().st_size > available // 2


def _unsupported(config: Any, ranks: int, fold: tuple[int, int] | None, stale_gradients: bool) -> str | None:
    """What a streamed run does not do yet (None: this run can stream)."""
    data, training = config.data, config.training
    suffix = "".join(Path(data.train).suffixes[-1:]).lower() if data.train else ""
    checks = [
        (data.synthetic is not None or data.train is None, "streaming reads a training file (data.train)"),
        (suffix not in (".csv", ".parquet", ".jsonl", ".ndjson"), "streaming reads a plain .csv, .jsonl or .parquet "
                                                                  f"file, not {data.train}"),
        (ranks > 1 and stale_gradients, f"distributed.strategy {config.distributed.strategy} (asynchronous SGD) is not "
                                        "streamed yet"),
        (fold is not None, "cross-validation is not streamed yet"),
        (bool(data.label_columns), "a target of several 0/1 columns is not streamed yet (one column of '|'-separated "
                                   "labels is)"),
        (data.validation is not None or data.test is not None, "held-out rows come from data.train by the hash rule; "
                                                                 "separate data.validation / data.test files are not streamed yet"),
        (data.shape is not None or training.augment is not None, "image rows (data.shape, training.augment) are not "
                                                                  "streamed yet"),
        (any(getattr(c, "type", c) == "image" for c in data.columns.values()), "image columns are not streamed yet"),
    ]
    return next((why for bad, why in checks if bad), None)


def within_memory(cfg: DataConfig, streamed: bool, doing: str, make: Callable[[], T]) -> T:
    """`make()`; a MemoryError in it (reading, encoding or streaming the data, in any thread) raised
    as a DataError saying what ran out, the memory budget and the fix."""
    try:
        return make()
    except MemoryError:
        raise DataError(out_of_memory(cfg, streamed, doing)) from None


def out_of_memory(cfg: DataConfig, streamed: bool, doing: str) -> str:
    """The message for running out of memory while `doing` (e.g. 'reading and encoding the data')."""
    available = B.host_memory_available()
    budget = B.budget_text(available) if available is not None else "no memory budget could be read"
    fix = ("a streamed run holds one block of the file (64 MiB of CSV or JSON Lines text, or one Parquet row group), "
           "the batches and the model: set a smaller training.batch_size (and training.eval_batch_size), write a "
           "Parquet file with smaller row groups, or give the process more memory") if streamed else \
        ("set data.stream: true to read the file block by block instead of whole, or give the process more memory")
    return f"{cfg.train or 'the data'}: ran out of memory while {doing}; the memory budget: {budget}. To fix: {fix}"
