"""The streamed run's two fitting passes (issue 48), split over the ranks: rank r of N surveys and
encodes blocks r, r+N, ... of the file, and every rank merges what all of them found, exactly:

- row counts (a text file's blocks counted by their lines, by the rank that reads each), labels and
  category values (set unions), the distinct numbers of a column (unions, capped as one pass caps);
- the sample the column types and fills (medians) are fitted on: each rank's bottom-k rows by hash,
  merged into the bottom k of all (the bottom k of a union is within the union of bottom ks; ties go
  by position): the same rows as one process's, so the medians are exact, not a sketch's bound;
- the normalizer: each block's exact moments (data/metrics.py's `Moments`) and range, merged block
  by block in file order, as one process merges them: bitwise one process's; each split's targets
  gathered in file order.
`FitRanks` carries the collectives (distributed/stream_ranks.py's `fit_ranks` makes it from the
communicator; one process: no collectives). Each rank keeps the blocks it encodes in its own cache of
encoded rows; the caches are joined (`stream_cache.JoinedBlocks`), so a node's ranks read any block
its ranks encoded from the page cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..config.data import DataConfig
from ..core import backend as B
from ..errors import DataError
from . import stream
from .columns import ColumnEncoder, RawColumns, canonical, is_missing
from .metrics import Moments
from .normalize import Normalizer, normalize_method
from .prepare import encode_features, map_labels
from .stream_cache import EncodedBlocks, JoinedBlocks
from .table import ReadSpec, Table
from .targets import target_task

SAMPLE_ROWS = 1 << 16  # training rows the column types and fills are fitted on
DISTINCT_NUMBERS = 1 << 16  # distinct number cells a column's survey collects (for a column text elsewhere)


def _alone(make: Callable[[], Any]) -> list[Any]:
    return [make()]


def _here(make: Callable[[], Any]) -> Any:
    return make()


@dataclass(frozen=True)
class FitRanks:
    """This rank among those splitting the fitting passes, and the collectives they merge through:
    `gathered(make)`: every rank's `make()` (a DataError on any rank raised on all of them together);
    `together(make)`: this rank's, errors raised alike."""
    rank: int = 0
    size: int = 1
    gathered: Callable[[Callable[[], Any]], list[Any]] = _alone
    together: Callable[[Callable[[], Any]], Any] = _here

    def mine(self, count: int) -> list[int]:
        """This rank's blocks of `count`: r, r + N, ..."""
        return list(range(self.rank, count, self.size))

    def guarded(self, wrap: Callable[[Callable[[], Any]], Any]) -> "FitRanks":
        """These ranks with each one's work run through `wrap` (e.g. a MemoryError made a DataError,
        then raised on every rank together)."""
        return FitRanks(self.rank, self.size, lambda make: self.gathered(lambda: wrap(make)),
                        lambda make: self.together(lambda: wrap(make)))

    def interleaved(self, parts: list[list[Any]]) -> list[Any]:
        """Every rank's per-block results (each in its `mine` order) in file order."""
        out: list[Any] = [None] * sum(len(p) for p in parts)
        for r, part in enumerate(parts):
            out[r::self.size] = part
        return out


@dataclass
class Survey:
    """The first pass: blocks counted, rows per split, the labels, training text values, a sample."""
    blocks: list[stream.Block] = field(default_factory=list)
    rows: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    labels: set = field(default_factory=set)  # the distinct target cells (labelled tasks only)
    values: dict[int, set] = field(default_factory=dict)  # text columns' training values
    numbers: dict[int, set | None] = field(default_factory=dict)  # number-typed cells' (None: too many)
    keys: np.ndarray = field(default_factory=lambda: np.empty(0))
    sample: RawColumns | None = None
    features: list[str] = field(default_factory=list)
    source: str = ""
    file: stream.BlockFile | None = None


def survey(path: Path, spec: ReadSpec, cfg: DataConfig, seed: int, block_bytes: int, labelled: bool = True,
           sample_rows: int = SAMPLE_ROWS, ranks: FitRanks = FitRanks()) -> Survey:
    """One pass over the blocks (memory: a block, the sample, the distinct values; the distinct
    target cells when `labelled`, the loss's targets being labels); on N ranks each reads its own."""
    file = ranks.together(lambda: stream.BlockFile.of(path, spec))  # (the dialect sniffed, the header read, once)
    look = lambda found, block, table: _surveyed(found, block, table, cfg, seed, labelled, sample_rows)  # noqa: E731
    if ranks.size == 1:  # one process: blocks counted as they are read, in file order
        found = Survey(file=file)
        for block, table in stream.counted(file, file.blocks(block_bytes)):
            found.blocks.append(block)
            look(found, block, table)
        return found
    blocks = counted_blocks(file, ranks.together(lambda: file.blocks(block_bytes)), ranks)  # (a read error alike)

    def local() -> Survey:
        found, read = Survey(), file.reader()
        for i in ranks.mine(len(blocks)):
            look(found, blocks[i], read(blocks[i], blocks[i].first_row))
        return found
    found = merged(ranks.gathered(local), sample_rows)
    found.blocks, found.file = blocks, file
    return found


def counted_blocks(file: stream.BlockFile, blocks: list[stream.Block], ranks: FitRanks) -> list[stream.Block]:
    """The blocks with their first rows and row counts: a Parquet file's from its footer; a text
    file's lines counted by the rank that reads each block (bytes only, not parsed), shared."""
    if all(block.rows >= 0 for block in blocks):
        return blocks
    mine = ranks.mine(len(blocks))
    counts = np.array(ranks.interleaved(ranks.gathered(lambda: [file.count(blocks[i]) for i in mine])), np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return [stream.Block(b.lo, b.hi, int(s), int(n)) for b, s, n in zip(blocks, starts, counts)]


def _surveyed(found: Survey, block: stream.Block, table: Table, cfg: DataConfig, seed: int, labelled: bool,
              sample_rows: int) -> None:
    """One block's rows added to the survey."""
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
    _numbers_seen(found, table.raw, train)
    _sampled(found, table.raw.rows(train), stream.row_hash(positions[train], seed, salt=1), sample_rows)


def merged(parts: list[Survey], sample_rows: int) -> Survey:
    """The ranks' surveys as one: what one process's pass over all the blocks finds."""
    found = Survey()
    for part in parts:
        found.rows += part.rows
        found.labels |= part.labels
        for j, values in part.values.items():
            found.values.setdefault(j, set()).update(values)
        for j, numbers in part.numbers.items():
            both = found.numbers.get(j, set())
            both = None if both is None or numbers is None else both | numbers
            found.numbers[j] = None if both is None or len(both) > DISTINCT_NUMBERS else both
        if part.source:
            found.features, found.source = part.features, part.source
        if part.sample is not None:
            _joined(found, part.sample, part.keys)
    if found.sample is not None:  # in file order (ties between keys go by position, as in one pass)
        order = np.argsort(found.sample.row_ids, kind="stable")
        found.keys, found.sample = found.keys[order], found.sample.rows(order)
        _kept(found, sample_rows)
    return found


def _joined(found: Survey, raw: RawColumns, keys: np.ndarray) -> None:
    """The sample's rows and `raw`'s (a column read as text in any block is text, its number cells written out)."""
    both, old = raw, found.sample
    if old is not None:
        text = {j: np.concatenate([old.cells(j), raw.cells(j)]) for j in set(old.text) | set(raw.text)}
        both = RawColumns(np.concatenate([old.x, raw.x]), text, np.concatenate([old.row_ids, raw.row_ids]))
    found.keys, found.sample = np.concatenate([found.keys, keys]), both


def _kept(found: Survey, k: int) -> None:
    """Keep the k rows whose keys are lowest: a uniform sample, whatever the blocks."""
    lowest = np.sort(np.argsort(found.keys, kind="stable")[:k])  # in file order
    found.keys, found.sample = found.keys[lowest], found.sample.rows(lowest)


def _sampled(found: Survey, raw: RawColumns, keys: np.ndarray, k: int) -> None:
    _joined(found, raw, keys)
    _kept(found, k)
def _numbers_seen(found: Survey, raw: RawColumns, rows: np.ndarray) -> None:
    """Each column's distinct training values in the blocks that read it as numbers, up to
    DISTINCT_NUMBERS (then None): a column text in other blocks is a category holding them too."""
    for j in range(raw.x.shape[1]):
        if j in raw.text or found.numbers.get(j, set()) is None:
            continue
        column = raw.x[rows, j]
        seen = found.numbers.setdefault(j, set())
        seen.update(np.unique(column[~np.isnan(column)]).tolist())
        if len(seen) > DISTINCT_NUMBERS:
            found.numbers[j] = None


def widened(encoder: ColumnEncoder, found: Survey) -> ColumnEncoder:
    """The sample's category columns given every value the training rows hold (number cells written
    as text is, `RawColumns.cells`); a category whose number cells are too many to collect is refused."""
    for j, column in enumerate(encoder.columns):
        if column.kind != "category":
            continue
        if j in found.numbers and found.numbers[j] is None:
            raise DataError(f"{found.source}: column {column.name!r} is read as categories, but in blocks where its "
                            f"cells are all numbers they hold over {DISTINCT_NUMBERS:,} distinct values, more than a "
                            "streamed run collects in its bounded pass. Declare the column (data.columns."
                            f"{column.name}: number, or ignore), or set data.stream: false")
        numbers = [np.format_float_positional(v, trim="-") for v in sorted(found.numbers.get(j) or ())]
        cells = np.array(sorted(found.values.get(j, set())) + numbers, dtype=object).astype(str)
        column.categories = sorted(set(column.categories) | set(canonical(cells[~is_missing(cells)]).tolist()))
    return encoder


def fitted_normalizer(source: Any, cfg: DataConfig, width: int,
                      ranks: FitRanks = FitRanks()) -> tuple[Normalizer, dict[int, np.ndarray]]:
    """The second pass: the encoded training rows' exact moments and range give the normalizer (as
    `Normalizer.fit` gives it on all of them, with its checks); each split's targets are kept, in file
    order. Each rank encodes its blocks (read ahead in a background thread), caching them; the
    blocks' statistics are merged in file order on every rank."""
    numbers = number_columns(source.encoder, width)
    parts = ranks.gathered(lambda: _encoded_blocks(source, cfg, numbers, ranks.mine(len(source.blocks))))
    moments, low, high = Moments(), np.full(width, np.inf), np.full(width, -np.inf)
    targets: dict[int, list[np.ndarray]] = {code: [] for code in stream.SPLITS}
    dtype = np.dtype(B.current().floatx)
    for block_moments, block_low, block_high, block_targets, dtype in ranks.interleaved(parts):
        moments.merge(block_moments)
        low[numbers], high[numbers] = np.minimum(low[numbers], block_low), np.maximum(high[numbers], block_high)
        for code in targets:
            targets[code].append(block_targets[code])
    s, method = float(cfg.scale or 1.0), normalize_method(cfg, np.empty((0, width)))
    shift, spread = np.zeros(width), np.ones(width)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused by Normalizer.of, named
        if method == "standard" and len(moments.count):
            std = np.sqrt(moments.variance) * s
            shift[numbers], spread[numbers] = moments.mean * s, np.where(std > 0, std, 1.0)
        elif method == "minmax":
            shift, spread = low * s, np.where(high > low, (high - low) * s, 1.0)
    mask = source.encoder.number_mask() if source.encoder.columns else None
    largest = lambda j: float(max(abs(low[j]), abs(high[j])))  # noqa: E731  (for the message only)
    normalizer = Normalizer.of(shift, spread, s, method, mask, dtype, source.encoder.output_names(),
                               str(source.path), largest)
    return normalizer, {code: np.concatenate(parts) for code, parts in targets.items()}


def _encoded_blocks(source: Any, cfg: DataConfig, numbers: np.ndarray, mine: list[int]) -> list[tuple]:
    """Blocks `mine` encoded (into the source's cache, each split apart), each one's training rows'
    moments and range over the number columns, each split's targets and the features' dtype."""
    read, rule = source.file.reader(), target_task(source.task)

    def work(block: stream.Block) -> tuple[np.ndarray, np.ndarray]:
        table = read(block, block.first_row)
        y = compact(rule.encode(map_labels(table.y, cfg.label_map), source.classes, table.source, table.raw),
                    len(source.classes))
        return encode_features(table, source.encoder)[0], y

    found, order = [], [source.blocks[i] for i in mine]
    for block, (x, y) in zip(order, stream.prefetched(work, order)):
        codes, moments = source.codes(block), Moments()
        targets = {code: y[codes == code] for code in stream.SPLITS}
        if source.cache is not None:  # each split's rows apart: a pass reads its own, whole
            for code in targets:
                source.cache.put((block, code), x[codes == code], targets[code])
            if all((block, code) in source.cache.entries for code in targets):
                source.file.release(block)  # read from the cache from now on
        train = x[np.flatnonzero(codes == stream.TRAIN)[:, None], numbers].astype(np.float64)  # (number columns only)
        moments.add(train)
        low, high = (train.min(axis=0), train.max(axis=0)) if len(train) else (np.inf, -np.inf)
        found.append((moments, low, high, targets, x.dtype))
    return found


def joined_caches(cache: EncodedBlocks | None, ranks: FitRanks) -> EncodedBlocks | JoinedBlocks | None:
    """Every rank's cache of the blocks it encoded, for this rank to read (the other ranks' files
    opened through /proc on the same host; on other hosts their blocks are parsed again)."""
    if ranks.size == 1:
        return cache
    caches = ranks.gathered(lambda: cache)
    caches[ranks.rank] = cache
    return JoinedBlocks([c for c in caches if c is not None])


def compact(y: np.ndarray, classes: int) -> np.ndarray:
    """Class indices in the smallest unsigned type that holds them (1 byte a row for up to 256
    classes, not 8: a streamed run keeps every row's target); other targets as they are."""
    if y.dtype != np.int64 or y.ndim != 1:
        return y
    return y.astype(np.min_scalar_type(max(0, classes - 1)))


def number_columns(encoder: ColumnEncoder, width: int) -> np.ndarray:
    """The encoded columns the normalizer scales (every one for arrays without an encoder)."""
    return np.flatnonzero(encoder.number_mask()) if encoder.columns else np.arange(width)

