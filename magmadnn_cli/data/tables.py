"""Data: CSV (header, target column by name), NPZ (`x`, `y`), and synthetic teacher-network data;
seeded splits, label encoding, and normalization fitted on the training split only."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core import backend as B
from ..config.schema import DataConfig, SyntheticData
from ..errors import DataError
from .csv_reader import STDIN, CsvFormat, check_file, csv_header, detect, is_stream, iter_csv_chunks, parse_rows
from ..files import load_npz
from .images import image_format, read_images


@dataclass
class Table:
    """Features (float32, one row per sample), raw targets (labels or values) and feature names."""
    x: np.ndarray
    y: np.ndarray | None
    features: list[str]
    source: str


# -- reading -------------------------------------------------------------------------------------
def read_csv(path: Path, target: str | None, features: list[str] | None, need_target: bool = True,
             fmt: CsvFormat | None = None) -> Table:
    fmt = fmt or detect(path)
    names = csv_header(path, fmt)
    if need_target:
        if target is None:
            raise DataError(f"{path}: data.target must name the target column; columns are {', '.join(names)}")
        if target not in names:
            raise DataError(f"{path}: no target column {target!r}; columns are {', '.join(names)}")
    wanted = features or [n for n in names if n != target]
    missing = [f for f in wanted if f not in names]
    if missing:
        raise DataError(f"{path}: missing feature column(s) {', '.join(missing)}; the file has {', '.join(names)}")
    if not wanted:
        raise DataError(f"{path}: no feature columns besides the target {target!r}")
    feature_cols = [names.index(f) for f in wanted]
    xs, ys = [], []
    for first_line, lines in iter_csv_chunks(path, fmt=fmt):
        xs.append(parse_rows(lines, path, names, feature_cols, first_line, fmt))
        if need_target and target is not None:
            ys.append(parse_rows(lines, path, names, [names.index(target)], first_line, fmt, str)[:, 0])
    if not xs:
        raise DataError(f"{path}: the CSV has a header but no data rows")
    x = np.concatenate(xs)
    y = _typed_labels(np.concatenate(ys)) if ys else None
    _check_finite(x, path, wanted)
    return Table(x, y, wanted, str(path))


def _typed_labels(raw: np.ndarray) -> np.ndarray:
    """Targets as ints if they all are, else floats if they all are, else stripped strings."""
    raw = np.char.strip(raw.astype(str))
    if np.any(raw == ""):
        row = int(np.flatnonzero(raw == "")[0])
        raise DataError(f"the target column has an empty cell (data row {row + 1})")
    for kind in (np.int64, np.float64):
        try:
            return raw.astype(kind)
        except (ValueError, OverflowError):
            continue
    return raw


def _check_finite(x: np.ndarray, source: Path | str, names: list[str]) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise DataError(f"{source}: column {names[col]!r}, data row {row + 1}: non-finite value {x[row, col]} "
                        "(NaN or infinity); clean the data first")


def read_npz(path: Path, need_target: bool = True) -> Table:
    check_file(path)
    f = load_npz(path, ".npz file", DataError, keys=("x", "y"))
    if "x" not in f or (need_target and "y" not in f):
        with np.load(path, allow_pickle=False) as archive:  # just its names (read a moment ago)
            held = sorted(archive.files)
        raise DataError(f"{path}: expected arrays 'x' and 'y'; the file holds {held or 'nothing'}")
    x, y = f["x"], f.get("y")
    if x.dtype.kind not in "biuf":
        raise DataError(f"{path}: x must be numeric; received dtype {x.dtype}")
    if x.ndim < 2 or len(x) == 0:
        raise DataError(f"{path}: x must have shape (samples, features...); received {x.shape}")
    if y is not None and len(y) != len(x):
        raise DataError(f"{path}: x has {len(x)} rows but y has {len(y)}")
    x = x.astype(np.float32)
    flat = x.reshape(len(x), -1)
    _check_finite(flat, path, [f"x[{i}]" for i in range(flat.shape[1])])
    return Table(x, y, [f"x{i}" for i in range(flat.shape[1])], str(path))


CSV_SUFFIXES = tuple(f"{kind}{packed}" for kind in (".csv", ".tsv", ".txt") for packed in ("", ".gz", ".bz2", ".xz"))


def read_table(path: Path, target: str | None, features: list[str] | None, need_target: bool = True,
               delimiter: str | None = None, encoding: str = "utf-8") -> Table:
    name = path.name.lower()
    if str(path) == STDIN or (is_stream(path) and not name.endswith(".npz")):
        return read_csv(path, target, features, need_target, detect(path, delimiter, encoding))  # CSV text
    if path.exists() and image_format(path):
        x, y = read_images(path)
        return Table(x, y, [f"pixel{i}" for i in range(int(np.prod(x.shape[1:])))], str(path))
    if name.endswith(".npz"):
        return read_npz(path, need_target)
    if name.endswith(CSV_SUFFIXES):
        return read_csv(path, target, features, need_target, detect(path, delimiter, encoding))
    check_file(path)
    raise DataError(f"{path}: unknown data format; expected .csv, .tsv or .txt (also .gz, .bz2, .xz), .npz, MNIST "
                    "*-idx3-ubyte[.gz] or CIFAR-10 batches (data_batch_*.bin, data_batch_*)")


def synthetic(spec: SyntheticData, seed: int) -> Table:
    """Classification data labelled by a random teacher network (tanh hidden layer), plus noise."""
    B.require_memory(spec.samples * (spec.features * 12 + spec.classes * 16),
                     f"data.synthetic ({spec.samples:,} samples x {spec.features:,} features)", on_host=True)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(spec.samples, spec.features)).astype(np.float32)
    w1 = rng.normal(size=(spec.features, spec.hidden)) / np.sqrt(spec.features)
    w2 = rng.normal(size=(spec.hidden, spec.classes)) / np.sqrt(spec.hidden)
    scores = np.tanh(x @ w1) @ w2 + spec.noise * rng.normal(size=(spec.samples, spec.classes))
    return Table(x, scores.argmax(axis=1), [f"x{i}" for i in range(spec.features)], "synthetic")


# -- preparing -----------------------------------------------------------------------------------
@dataclass
class Normalizer:
    """x -> (x * scale - shift) / spread, fitted on the training split."""
    scale: float = 1.0
    shift: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    spread: np.ndarray = field(default_factory=lambda: np.ones(0, np.float32))

    @classmethod
    def fit(cls, x: np.ndarray, method: str, scale: float | None) -> "Normalizer":
        s = float(scale or 1.0)
        flat = x.reshape(len(x), -1) * s
        if method == "minmax":
            low, high = flat.min(axis=0), flat.max(axis=0)
            return cls(s, low.astype(np.float32), np.where(high > low, high - low, 1.0).astype(np.float32))
        if method == "standard":
            std = flat.std(axis=0)
            return cls(s, flat.mean(axis=0).astype(np.float32), np.where(std > 0, std, 1.0).astype(np.float32))
        width = flat.shape[1]
        return cls(s, np.zeros(width, np.float32), np.ones(width, np.float32))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        flat = x.reshape(len(x), -1).astype(np.float32)
        if self.scale != 1.0:
            flat = flat * np.float32(self.scale)
        out = (flat - self.shift) / self.spread
        return out.reshape(x.shape).astype(np.float32, copy=False)


@dataclass
class Split:
    x: np.ndarray
    y: np.ndarray  # class indices (classification), 0/1 column (binary), or values (regression)


@dataclass
class Prepared:
    train: Split
    validation: Split | None
    test: Split | None
    classes: list[Any]          # labels as in the data ([] for regression)
    features: list[str]
    sample_shape: tuple[int, ...]
    normalizer: Normalizer
    source: str


def encode_targets(y: np.ndarray, task: str, classes: list[Any], source: str) -> np.ndarray:
    if task == "regression":
        try:
            values = np.asarray(y, dtype=np.float32)
        except ValueError as exc:
            raise DataError(f"{source}: regression targets must be numbers ({exc})") from exc
        bad = ~np.isfinite(values.reshape(len(values), -1))
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise DataError(f"{source}: the target of data row {row + 1} is {values.reshape(len(values), -1)[row]} "
                            f"({int(bad.any(axis=1).sum())} non-finite target(s) in all): the loss would be NaN; "
                            "drop or fill those rows")
        return values.reshape(len(values), -1)
    lookup = {str(label): i for i, label in enumerate(classes)}
    values, inverse = np.unique(y, return_inverse=True)
    unknown = [str(v) for v in values if str(v) not in lookup]
    if unknown:
        raise DataError(f"{source}: labels {', '.join(unknown[:10])} do not occur in the training data "
                        f"(known: {', '.join(map(str, classes))})")
    idx = np.array([lookup[str(v)] for v in values], dtype=np.int64)[inverse.ravel()]
    return idx.astype(np.float32).reshape(-1, 1) if task == "binary" else idx.astype(np.int64)


def class_labels(y: np.ndarray, task: str, source: str) -> list[Any]:
    if task == "regression":
        return []
    labels = [v.item() if hasattr(v, "item") else v for v in np.unique(y)]
    if len(labels) < 2:
        raise DataError(f"{source}: the target has a single class ({labels[0]!r}); need at least 2 to learn")
    if task == "binary" and len(labels) != 2:
        raise DataError(f"{source}: binary_cross_entropy needs exactly 2 classes; the target has {len(labels)}")
    return labels


def reshaped(table: Table, shape: list[int] | None) -> Table:
    """Rows reshaped to `data.shape` (e.g. 784 pixel columns -> (1, 28, 28))."""
    if not shape:
        return table
    width = int(np.prod(table.x.shape[1:]))
    if int(np.prod(shape)) != width:
        raise DataError(f"data.shape: {shape} holds {int(np.prod(shape))} values per sample; "
                        f"{table.source} has {width} feature values per row")
    table.x = table.x.reshape((len(table.x), *shape))
    return table


def prepare(cfg: DataConfig, task: str, seed: int) -> Prepared:
    """Read the configured data, split it (seeded), encode labels and fit the normalizer."""
    table = synthetic(cfg.synthetic, seed) if cfg.synthetic else \
        read_table(cfg.train, cfg.target, cfg.features, True, cfg.delimiter, cfg.encoding)
    table = reshaped(table, cfg.shape)
    if table.y is None:
        raise DataError(f"{table.source}: no targets")
    classes = class_labels(table.y, task, table.source)
    if task == "regression":
        encode_targets(table.y, task, classes, table.source)  # non-finite targets named by their file row
    order = np.random.default_rng(seed).permutation(len(table.x))
    n_test = int(round(cfg.test_split * len(order))) if cfg.test is None else 0
    n_val = int(round(cfg.validation_split * len(order))) if cfg.validation is None else 0
    parts = {"test": order[:n_test], "validation": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
    if len(parts["train"]) == 0:
        raise DataError(f"{table.source}: no training rows left after the validation/test split")
    normalizer = Normalizer.fit(table.x[parts["train"]], cfg.normalize, cfg.scale)

    def split(x: np.ndarray, y: np.ndarray, source: str) -> Split:
        return Split(normalizer(x), encode_targets(y, task, classes, source))

    train = split(table.x[parts["train"]], table.y[parts["train"]], table.source)
    extra: dict[str, Split | None] = {}
    for name in ("validation", "test"):
        path = getattr(cfg, name)
        if path is not None:
            other = reshaped(read_table(path, cfg.target, cfg.features, True, cfg.delimiter, cfg.encoding), cfg.shape)
            if other.features != table.features or other.x.shape[1:] != table.x.shape[1:]:
                raise DataError(f"{path}: its columns {other.features[:5]}... differ from the training data's")
            extra[name] = split(other.x, other.y, str(path))
        elif len(parts[name]):
            extra[name] = split(table.x[parts[name]], table.y[parts[name]], table.source)
        else:
            extra[name] = None
    shape = tuple(table.x.shape[1:])
    return Prepared(train, extra["validation"], extra["test"], classes, table.features, shape, normalizer, table.source)


def sample_shape_of(cfg: DataConfig) -> tuple[int, ...]:
    """The per-sample input shape, read cheaply (CSV header, NPZ array header) without loading the data."""
    if cfg.shape:
        return tuple(cfg.shape)
    if cfg.synthetic is not None:
        return (cfg.synthetic.features,)
    path = cfg.train
    if path.exists() and image_format(path):
        return tuple(read_images(path)[0].shape[1:])
    if path.name.lower().endswith(".npz"):
        return tuple(read_npz(path).x.shape[1:])
    names = csv_header(path, detect(path, cfg.delimiter, cfg.encoding))
    features = cfg.features or [n for n in names if n != cfg.target]
    return (len(features),)
