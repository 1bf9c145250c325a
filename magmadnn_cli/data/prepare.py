"""From a read table to training data: seeded (stratified) splits and folds, feature columns encoded
and inputs normalized with statistics of the training rows only, labels encoded, regression targets
standardized. Everything fitted here is stored with the model."""

from __future__ import annotations

import difflib
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..config.data import DataConfig
from ..core import backend as B
from ..errors import DataError
from .cells import RawColumns
from .columns import ColumnEncoder
from .fitting import fit
from .classes import case_variants, rare_classes, unseen_note
from .metrics import class_counts
from .leakage import chance_share, column_codes, repeated_rows, repeats_note, target_copies
from .pixels import check_shape, eight_bit_note, unscaled_note
from .normalize import Normalizer, TargetScaler, normalize_method, scale_note
from .row_index import without_row_index
from .targets import number_of, table_task, target_task
from .scaling import check_scale
from .readers import ReadSpec, Table, read_table, synthetic, typed_labels


@dataclass
class Split:
    x: np.ndarray
    y: np.ndarray  # class indices (classification), 0/1 column (binary), or values (regression, scaled)


@dataclass
class Prepared:
    train: Split
    validation: Split | None
    test: Split | None
    classes: list[Any]          # labels as in the data ([] for regression)
    features: list[str]         # the raw feature columns a model file's user must give
    sample_shape: tuple[int, ...]
    normalizer: Normalizer
    source: str
    encoder: ColumnEncoder = field(default_factory=lambda: ColumnEncoder([]))
    targets: TargetScaler = field(default_factory=TargetScaler)
    notes: list[str] = field(default_factory=list)   # what was inferred or imputed, said once
    settled: dict[str, Any] = field(default_factory=dict)  # data.* settings read off the training file
    task: str = "classification"  # the loss's task, as these targets make it (label sets: multilabel)


def map_labels(y: np.ndarray | None, mapping: dict[Any, Any], source: str | None = None) -> np.ndarray | None:
    """Targets with data.label_map applied; types inferred again. A key matches the label spelled the
    same, or the same number (2 and 2.0). With `source` (the training data), a key that matches no
    label is refused, with the closest label."""
    if not mapping or y is None:
        return y
    uniques, inverse = np.unique(y.astype(str), return_inverse=True)
    texts = set(uniques.tolist())
    numbers = {n: u for u in texts if (n := number_of(u)) is not None}
    lookup = {}
    for key, new in mapping.items():
        label = str(key) if str(key) in texts else numbers.get(number_of(str(key)))
        if label is None and source is not None:
            raise DataError(f"{source}: data.label_map key {key!r} matches no label of the target"
                            f"{_closest_label(str(key), uniques.tolist())}; the labels are "
                            f"{', '.join(map(repr, uniques[:20].tolist()))}{' ...' if len(uniques) > 20 else ''}")
        lookup[label] = str(new)
    return typed_labels(np.array([lookup.get(u, u) for u in uniques])[inverse.ravel()])


def _closest_label(key: str, labels: list[str]) -> str:
    close = [u for u in labels if u.lower() == key.lower()] or difflib.get_close_matches(key, labels, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def class_weights(spec: Any, classes: list[Any], train_y: np.ndarray, task: str = "classification") -> np.ndarray | None:
    """Per-class loss weights: `balanced` = rows / (classes x the class's training rows), as
    scikit-learn's class_weight='balanced'; a mapping {label: weight} (unlisted labels: 1)."""
    if spec is None:
        return None
    if target_task(task).codes(train_y[:1]) is None:
        raise DataError(f"training.class_weight weighs the one class of each row; this {task} target has "
                        "none (several labels a row): remove training.class_weight")
    if spec == "balanced":
        return len(train_y) / (len(classes) * np.maximum(class_counts(train_y, len(classes)), 1))
    known = {str(c): i for i, c in enumerate(classes)}
    unknown = [str(k) for k in spec if str(k) not in known]
    if unknown:
        raise DataError(f"training.class_weight: no class {unknown[0]!r} in the data; the classes are "
                        f"{', '.join(map(str, classes[:20]))}")
    weights = np.ones(len(classes))
    for label, weight in spec.items():
        weights[known[str(label)]] = weight
    return weights


# -- splits and folds ----------------------------------------------------------------------------
def stratified_order(n: int, seed: int, codes: np.ndarray | None) -> np.ndarray:
    """A seeded permutation of the rows; with class codes, reordered so that every prefix (and every
    K-th row) holds each class in its share: rows sorted stably by their rank within their class
    over the class's size."""
    order = np.random.default_rng(seed).permutation(n)
    if codes is None:
        return order
    c = codes[order]
    counts = np.bincount(c)
    rank = np.empty(n, np.int64)
    sorted_rows = np.argsort(c, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank[sorted_rows] = np.arange(n) - np.repeat(starts, counts)
    quantile = (rank + 0.5) / counts[c]
    return order[np.argsort(quantile, kind="stable")]


def split_rows(n: int, cfg: DataConfig, seed: int, codes: np.ndarray | None,
               fold: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Row indices of the train, validation and test splits. With `fold` = (k, K): the test split
    is the k-th of K folds (every K-th row of the stratified order) and data.test_split is unused."""
    order = stratified_order(n, seed, codes)
    n_val = int(round(cfg.validation_split * n)) if cfg.validation is None else 0
    if fold is not None:
        k, folds = fold
        held = np.arange(n) % folds == k
        test, rest = order[held], order[~held]
        return {"test": test, "validation": rest[:n_val], "train": rest[n_val:]}
    n_test = int(round(cfg.test_split * n)) if cfg.test is None else 0
    return {"test": order[:n_test], "validation": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}


# -- preparing -----------------------------------------------------------------------------------
def encode_features(table: Table, encoder: ColumnEncoder, strict: bool = False) -> tuple[np.ndarray, dict[str, Counter]]:
    """The table's encoded features (images and NPZ arrays pass through, refused if any cell is NaN)."""
    if table.x.ndim > 2 or encoder.width == 0:
        if np.isnan(table.x).any():
            raise DataError(f"{table.source}: the arrays hold NaN (missing values); image and NPZ data must be complete")
        return table.x, {}
    if encoder.identity and len(encoder.columns) != table.x.shape[1]:
        raise DataError(f"{table.source}: {table.x.shape[1]} feature columns; the model expects {len(encoder.columns)}")
    _check_encoded_size(table, encoder)
    return encoder.transform(table.raw, table.source, strict)


def _check_encoded_size(table: Table, encoder: ColumnEncoder) -> None:
    """Refuse, before allocating, an encoded matrix (plus the widest column's one-hot mask) larger
    than the host's available memory, naming the column that widens it most."""
    if encoder.identity:  # numbers only: at most a copy of the table already in memory
        return
    rows, available = len(table.x), B.host_memory_available()
    widest = max(encoder.columns, key=lambda c: c.width)
    need = rows * (encoder.width * table.x.dtype.itemsize + widest.width)
    if available is None or need <= available:
        return
    raise DataError(f"{table.source}: the encoded features would take {B.gib(need)} ({rows:,} rows x "
                    f"{encoder.width:,} inputs); the host has {B.gib(available)} available. The widest column: "
                    f"{widest.name!r} ({widest.width:,} inputs); leave it out (data.columns.{widest.name}: ignore), "
                    "or use fewer rows")


def reshaped(x: np.ndarray, shape: list[int] | None, source: str) -> np.ndarray:
    """Rows reshaped to `data.shape` (e.g. 784 pixel columns -> (1, 28, 28))."""
    if not shape:
        return x
    check_shape(x.shape[1:], shape, source)
    width, held = math.prod(x.shape[1:]), math.prod(shape)  # Python ints: no overflow
    if held != width:
        raise DataError(f"data.shape: {shape} holds {held} values per sample; {source} has {width} feature values "
                        "per row")
    return x.reshape((len(x), *shape))


def _read(cfg: DataConfig, seed: int) -> Table:
    table = synthetic(cfg.synthetic, seed) if cfg.synthetic else without_row_index(read_table(cfg.train, ReadSpec.of(cfg)), cfg)
    if table.y is None:
        raise DataError(f"{table.source}: no targets")
    table.y = map_labels(table.y, cfg.label_map, table.source)
    return table


def _split(table: Table, cfg: DataConfig, task: str, seed: int,
           fold: tuple[int, int] | None = None) -> tuple[list[Any], np.ndarray, dict[str, np.ndarray]]:
    """(the classes, the encoded targets, each split's rows): the seeded, stratified split."""
    rule = target_task(task)
    classes = sorted(cfg.label_columns) if cfg.label_columns else rule.labels(table.y, table.source)  # each listed
    labels = rule.encode(table.y, classes, table.source, table.raw)
    codes = rule.codes(labels) if cfg.stratify else None
    parts = split_rows(len(labels), cfg, seed, codes, fold)
    if len(parts["train"]) == 0:
        raise DataError(f"{table.source}: no training rows left after the validation/test split")
    return classes, labels, parts


def fit_encoder(table: Table, rows: np.ndarray, cfg: DataConfig) -> tuple[ColumnEncoder, list[str]]:
    if table.x.ndim > 2:
        return ColumnEncoder([]), []
    return fit(table.raw.rows(rows), table.features, cfg, table.source)


def prepare(cfg: DataConfig, task: str, seed: int, fold: tuple[int, int] | None = None) -> Prepared:
    """Read the configured data, split it (seeded, stratified for classes; or fold k of K), encode the
    columns, labels and targets and fit the normalizers, on the training rows only."""
    table = _read(cfg, seed)
    task = table_task(task, table.y)
    said = eight_bit_note(table.settled, cfg.scale, table.source)
    cfg = cfg.revised(**table.settled)  # the validation and test files are written alike
    classes, labels, parts = _split(table, cfg, task, seed, fold)
    encoder, notes = fit_encoder(table, parts["train"], cfg)
    rare = rare_classes(classes, labels, parts) if target_task(task).codes(labels) is not None and fold is None else ""
    notes = table.notes + notes + [n for n in [said, case_variants(classes), rare] if n]
    if table.x.ndim == 2 and cfg.shape is None:
        notes += target_copies(table.raw.rows(parts["train"]), table.features, labels[parts["train"]], task, cfg.target)
    x, _ = encode_features(table, encoder)
    x = reshaped(x, cfg.shape, table.source)
    numbers = encoder.number_mask() if encoder.columns else None
    method = normalize_method(cfg, x)
    notes += [n for n in [unscaled_note(x, cfg.scale, method, table.source)] if n]
    check_scale(x, cfg.scale, x.dtype if x.dtype.kind == "f" else np.dtype(B.current().floatx),
                encoder.output_names(), table.source)
    normalizer = Normalizer.fit(x[parts["train"]], method, cfg.scale, numbers, encoder.output_names(), table.source)
    notes += [n for n in [scale_note(x[parts["train"]], cfg, numbers, encoder.output_names())] if n]
    scale_targets = not target_task(task).decl.labels and cfg.target_normalize != "none"
    targets = TargetScaler.fit(labels[parts["train"]], table.source) if scale_targets else TargetScaler()
    splits: dict[str, Split | None] = {"train": Split(normalizer(x[parts["train"]]), targets(labels[parts["train"]]))}
    held: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # each held-out part's encoded rows and targets
    for name in ("validation", "test"):
        path = getattr(cfg, name) if fold is None else None
        part = _held_out_file(path, table, cfg, task, classes, encoder, x.shape[1:], notes) if path is not None \
            else (x[parts[name]], labels[parts[name]]) if len(parts[name]) else None
        if part is not None:
            held[f"{name} ({path})" if path is not None else name] = part
        splits[name] = Split(normalizer(part[0]), targets(part[1])) if part is not None else None
    train_raw = table.raw.rows(parts["train"]) if table.x.ndim == 2 else None
    notes += [n for n in [_repeats(x[parts["train"]], labels[parts["train"]], held, table.source, train_raw)] if n]
    return Prepared(splits["train"], splits["validation"], splits["test"], classes, table.features,
                    tuple(x.shape[1:]), normalizer, table.source, encoder, targets, notes, table.settled, task)


def _held_out_file(path: Path, table: Table, cfg: DataConfig, task: str, classes: list[Any], encoder: ColumnEncoder,
                   shape: tuple[int, ...], notes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """A separate validation or test file, encoded as the training rows were into samples of `shape`
    (their encoded rows and targets; its notes added to `notes`)."""
    other = read_table(path, replace(ReadSpec.of(cfg, features=table.features),
                                     features_from=f"the training file ({table.source})"))
    ox, unseen = encode_features(other, encoder)
    ox = reshaped(ox, cfg.shape, str(path))
    if ox.shape[1:] != shape:
        raise DataError(f"{path}: its samples have shape {ox.shape[1:]}; the training data's {shape}")
    notes += other.notes + [n for n in [unseen_note(unseen, str(path), encoder)] if n]
    return ox, target_task(task).encode(map_labels(other.y, cfg.label_map), classes, str(path), other.raw)


def rebuilt_split(cfg: DataConfig, task: str, seed: int, name: str, encoder: ColumnEncoder, normalizer: Any,
                  targets: Any) -> Split | None:
    """A run's own split (train, validation or test) rebuilt from its config and seed, encoded and
    scaled with what the run fitted (its model's encoder, normalizer and target scaling), not fitted
    again: today's defaults may differ from the run's. None where the run had no such split."""
    table = _read(cfg, seed)
    cfg = cfg.revised(**table.settled)
    _, labels, parts = _split(table, cfg, task, seed)
    if not len(parts[name]):
        return None
    x = reshaped(encode_features(table, encoder)[0], cfg.shape, table.source)
    return Split(normalizer(x[parts[name]]), targets(labels[parts[name]]))


def _repeats(x: np.ndarray, y: np.ndarray, held: dict[str, tuple[np.ndarray, np.ndarray]], source: str,
             raw: RawColumns | None) -> str | None:
    """The warning for held-out parts that repeat training rows (duplicate records split apart); the
    chance of a repeat is judged on the source columns (`raw`: the training rows' cells) where known."""
    counts = {name: (repeated_rows(x, y, hx, hy), len(hx)) for name, (hx, hy) in held.items()}
    if not any(n for n, _ in counts.values()):
        return None
    return repeats_note(counts, chance_share(column_codes(raw) if raw is not None else x), source)


def sample_shape_of(cfg: DataConfig, task: str, seed: int) -> tuple[int, ...]:
    """The per-sample input shape `prepare` gives (see `sample_inputs`)."""
    return sample_inputs(cfg, task, seed).shape


@dataclass
class SampleInputs:
    """What a network built for this data takes and must give, found without encoding every row:
    each sample's input shape, the column encoder behind it (None for arrays), and where the data
    were read: the classes and target columns (None when not read: arrays of a declared shape,
    synthetic data)."""
    shape: tuple[int, ...]
    encoder: ColumnEncoder | None = None
    classes: list[Any] | None = None
    targets: int = 1
    source: str = ""
    task: str | None = None     # the loss's task as these targets make it (None: not read)


def sample_inputs(cfg: DataConfig, task: str, seed: int) -> SampleInputs:
    """The per-sample input shape `prepare` gives, and the column encoder behind it: columns encoded
    as fitted on the training rows of the same split (a category seen only in held-out rows adds no
    input); with the classes and target columns the output must match."""
    if cfg.shape:
        return SampleInputs(tuple(cfg.shape))
    if cfg.synthetic is not None:
        return SampleInputs((cfg.synthetic.features,))
    table = _read(cfg, seed)
    task = table_task(task, table.y)
    classes, labels, parts = _split(table, cfg, task, seed)
    targets = int(labels.shape[1]) if labels.ndim == 2 and not target_task(task).decl.labels else 1
    if table.x.ndim > 2:
        return SampleInputs(tuple(table.x.shape[1:]), None, classes, targets, table.source, task)
    encoder, _ = fit_encoder(table, parts["train"], cfg)
    shape = tuple(table.x.shape[1:]) if not encoder.columns else (encoder.width,)
    return SampleInputs(shape, encoder, classes, targets, table.source, task)
