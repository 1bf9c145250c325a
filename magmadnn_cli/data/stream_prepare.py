"""Streamed epochs wired to `train` (issue 48, item 2; `data.stream`): the file is never held whole.

Two bounded passes over the blocks (data/stream.py) fit what `prepare` fits on the training rows:
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
from typing import Any, Iterator

import numpy as np

from ..config.data import DataConfig
from ..core import backend as B
from ..errors import DataError
from . import stream
from .columns import ColumnEncoder, RawColumns, canonical, is_missing
from .fitting import fit
from .metrics import Moments
from .normalize import Normalizer, TargetScaler, normalize_method
from .prepare import Prepared, Split, encode_features, map_labels
from .table import ReadSpec, Table, typed_labels
from .targets import table_task, target_task

SAMPLE_ROWS = 1 << 16  # training rows the column types and fills are fitted on
BUFFER_ROWS = 1 << 16  # rows an epoch's shuffle mixes at a time
SPLIT_CODES = {"train": stream.TRAIN, "validation": stream.VALIDATION, "test": stream.TEST}


@dataclass
class StreamSource:
    """The training file read block by block, with what was fitted on its training rows."""
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

    def codes(self, block: stream.Block) -> np.ndarray:
        positions = np.arange(block.first_row, block.first_row + block.rows)
        return stream.split_codes(positions, self.seed, self.cfg.validation_split, self.cfg.test_split)

    def encoded(self, block: stream.Block, code: int, normalized: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The block's rows of one split: (their positions in the file, encoded features, targets)."""
        table = stream.read_block(self.path, self.spec, block, block.first_row)
        keep = np.flatnonzero(self.codes(block) == code)
        part = Table(table.raw.rows(keep), table.y[keep], table.features, table.source)
        x, _ = encode_features(part, self.encoder)
        y = target_task(self.task).encode(map_labels(part.y, self.cfg.label_map), self.classes, table.source, part.raw)
        return block.first_row + keep, (self.normalizer(x) if normalized else x), self.targets(y)

    def in_file_order(self, code: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for block in self.blocks:
            _, x, y = self.encoded(block, code)
            yield x, y

    def epoch(self, epoch: int, shuffle: bool) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The epoch's training rows (positions, x, y) in pieces: blocks permuted by (seed, epoch) and
        rows mixed in a buffer (`stream.epoch_rows`); in file order with training.shuffle false."""
        read = lambda block: self.encoded(block, stream.TRAIN)  # noqa: E731
        if not shuffle:
            return (read(block) for block in self.blocks)
        return stream.epoch_rows(self.blocks, self.seed, epoch, self.buffer_rows, read)


class InOrder:
    """A split's encoded rows, read from the file in order as evaluation asks for them (slices in
    increasing order: one block and one batch held). Anything needing the rows at once is refused."""

    def __init__(self, source: StreamSource, code: int, rows: int, width: int, dtype: np.dtype) -> None:
        self.source, self.code = source, code
        self.shape, self.dtype, self.ndim = (rows, width), dtype, 2
        self._pieces: Iterator[tuple[np.ndarray, np.ndarray]] | None = None
        self._held, self._start = np.empty((0, width), dtype), 0

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, part: Any) -> np.ndarray:
        if not isinstance(part, slice) or part.step not in (None, 1):
            self.__array__()
        start, stop, _ = part.indices(len(self))
        if self._pieces is None or start < self._start:
            self._pieces, self._held, self._start = self.source.in_file_order(self.code), self._held[:0], 0
        while self._start + len(self._held) < stop:
            self._held = np.concatenate([self._held, next(self._pieces)[0]])
        self._held, self._start = self._held[start - self._start:], start
        return self._held[:stop - start]

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise DataError(f"{self.source.path}: with data.stream, the rows are read block by block and never held "
                        "at once; this needs them all (a checkpoint's data check, --resume): set data.stream: false")


@dataclass
class Survey:
    """The first pass: blocks counted, rows per split, the labels, training text values, a sample."""
    blocks: list[stream.Block] = field(default_factory=list)
    rows: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    labels: set = field(default_factory=set)  # the distinct target cells (labelled tasks only)
    values: dict[int, set] = field(default_factory=dict)
    keys: np.ndarray = field(default_factory=lambda: np.empty(0))
    sample: RawColumns | None = None
    features: list[str] = field(default_factory=list)
    source: str = ""


def survey(path: Path, spec: ReadSpec, cfg: DataConfig, seed: int, block_bytes: int, labelled: bool = True,
           sample_rows: int = SAMPLE_ROWS) -> Survey:
    """One pass over the blocks in file order (memory: a block, the sample, the distinct values; the
    distinct target cells when `labelled`, the loss's targets being labels)."""
    found = Survey()
    for block, table in stream.counted(path, spec, stream.blocks_of(path, spec, block_bytes)):
        found.blocks.append(block)
        found.features, found.source = table.features, table.source
        positions = np.arange(block.first_row, block.first_row + block.rows)
        codes = stream.split_codes(positions, seed, cfg.validation_split, cfg.test_split)
        found.rows += np.bincount(codes, minlength=3)
        if table.y is None:
            raise DataError(f"{table.source}: no target column {cfg.target!r}")
        if labelled:
            found.labels.update(np.unique(map_labels(table.y, cfg.label_map).astype(str)).tolist())
        train = np.flatnonzero(codes == stream.TRAIN)
        for j, cells in table.raw.text.items():
            found.values.setdefault(j, set()).update(np.unique(cells[train]).tolist())
        _sampled(found, table.raw.rows(train), stream.row_hash(positions[train], seed, salt=1), sample_rows)
    return found


def _sampled(found: Survey, raw: RawColumns, keys: np.ndarray, k: int) -> None:
    """Keep the k rows whose keys are lowest: a uniform sample, whatever the blocks."""
    both, old = raw, found.sample
    if old is not None:  # a column read as text in any block is text (its number cells written out)
        text = {j: np.concatenate([old.cells(j), raw.cells(j)]) for j in set(old.text) | set(raw.text)}
        both = RawColumns(np.concatenate([old.x, raw.x]), text, np.concatenate([old.row_ids, raw.row_ids]))
    keys = np.concatenate([found.keys, keys])
    lowest = np.sort(np.argsort(keys, kind="stable")[:k])  # in file order
    found.keys, found.sample = keys[lowest], both.rows(lowest)


def widened(encoder: ColumnEncoder, values: dict[int, set]) -> ColumnEncoder:
    """The sample's category columns given every value the training rows hold."""
    for j, column in enumerate(encoder.columns):
        if column.kind == "category" and j in values:
            cells = np.array(sorted(values[j]), dtype=object).astype(str)
            column.categories = sorted(set(column.categories) | set(canonical(cells[~is_missing(cells)]).tolist()))
    return encoder


def fitted_normalizer(source: StreamSource, cfg: DataConfig, width: int) -> tuple[Normalizer, dict[int, np.ndarray]]:
    """The second pass: the encoded training rows' exact moments and range give the normalizer (as
    `Normalizer.fit` computes it on all of them); each split's targets are kept, in file order."""
    moments, low, high = Moments(), np.full(width, np.inf), np.full(width, -np.inf)
    targets: dict[int, list[np.ndarray]] = {code: [] for code in SPLIT_CODES.values()}
    dtype = np.dtype(B.current().floatx)
    for block in source.blocks:
        table = stream.read_block(source.path, source.spec, block, block.first_row)
        codes = source.codes(block)
        x, _ = encode_features(table, source.encoder)
        dtype = x.dtype
        y = target_task(source.task).encode(map_labels(table.y, cfg.label_map), source.classes, table.source, table.raw)
        for code in targets:
            targets[code].append(y[codes == code])
        train = x[codes == stream.TRAIN].astype(np.float64)
        moments.add(train)
        if len(train):
            low, high = np.minimum(low, train.min(axis=0)), np.maximum(high, train.max(axis=0))
    s = float(cfg.scale or 1.0)
    method = normalize_method(cfg, np.empty((0, width)))
    shift, spread = np.zeros(width), np.ones(width)
    if method == "standard":
        std = np.sqrt(moments.variance) * s
        shift, spread = moments.mean * s, np.where(std > 0, std, 1.0)
    elif method == "minmax":
        shift, spread = low * s, np.where(high > low, (high - low) * s, 1.0)
    numbers = source.encoder.number_mask() if source.encoder.columns else None
    if numbers is not None and not numbers.all():
        shift, spread = np.where(numbers, shift, 0.0), np.where(numbers, spread, s)
    normalizer = Normalizer(s, shift.astype(dtype), spread.astype(dtype))
    return normalizer, {code: np.concatenate(parts) for code, parts in targets.items()}


def prepare_streamed(cfg: DataConfig, task: str, seed: int, block_bytes: int | None = None) -> Prepared:
    """`prepare`'s result for a streamed run: the encoder, classes and normalizer fitted in two bounded
    passes; each split a `Split` of `InOrder` rows and its targets."""
    path, spec = Path(cfg.train), ReadSpec.of(cfg)
    labelled = target_task(task).decl.labels
    found = survey(path, spec, cfg, seed, block_bytes or stream.BLOCK_BYTES, labelled)
    if found.sample is None or not len(found.sample.x):
        raise DataError(f"{path}: no training rows left after the validation/test split")
    cells = typed_labels(np.array(sorted(found.labels)))
    task = table_task(task, cells) if labelled else task  # label sets make a binary loss's task multi-label
    classes = target_task(task).labels(cells, found.source)
    encoder, notes = fit(found.sample, found.features, cfg, found.source)
    encoder = widened(encoder, found.values)
    source = StreamSource(path, spec, cfg, found.blocks, seed, encoder, Normalizer(), classes, task, BUFFER_ROWS)
    width = encoder.width or len(found.features)
    source.normalizer, targets = fitted_normalizer(source, cfg, width)
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


def streaming(config: Any, ranks: int, fold: tuple[int, int] | None) -> bool:
    """Whether this run streams (data.stream, auto resolved by the file's size), refusing, named,
    what streamed runs do not support yet."""
    data = config.data
    wanted = data.stream
    if wanted == "auto":
        wanted = bool(data.train and over_budget(Path(data.train)))
    if not wanted:
        return False
    problem = _unsupported(config, ranks, fold)
    if problem:
        raise DataError(f"data.stream: {data.stream}: {problem}; set data.stream: false to read the data into memory")
    return True


def over_budget(path: Path) -> bool:
    """data.stream: auto's rule: the file is larger than half the memory available."""
    available = B.host_memory_available()
    return path.is_file() and available is not None and path.stat().st_size > available // 2


def _unsupported(config: Any, ranks: int, fold: tuple[int, int] | None) -> str | None:
    """What a streamed run does not do yet (None: this run can stream)."""
    data, training = config.data, config.training
    suffix = "".join(Path(data.train).suffixes[-1:]).lower() if data.train else ""
    checks = [
        (data.synthetic is not None or data.train is None, "streaming reads a training file (data.train)"),
        (suffix not in (".csv", ".parquet"), f"streaming reads a plain .csv or .parquet file, not {data.train}"),
        (ranks > 1 and config.distributed.strategy == "async", "distributed.strategy async is not streamed yet"),
        (fold is not None, "cross-validation is not streamed yet"),
        (data.validation is not None or data.test is not None, "held-out rows come from data.train by the hash rule; "
                                                                 "separate data.validation / data.test files are not streamed yet"),
        (training.class_weight is not None, "training.class_weight is not supported when streaming yet"),
        (data.shape is not None or training.augment is not None, "image rows (data.shape, training.augment) are not "
                                                                  "streamed yet"),
        (any(getattr(c, "type", c) == "image" for c in data.columns.values()), "image columns are not streamed yet"),
    ]
    return next((why for bad, why in checks if bad), None)
