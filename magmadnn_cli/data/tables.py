"""Reading data: one reader registry (format -> read whole, read in chunks) used by train, validate,
evaluate, predict and summary, so every format one command accepts, all accept. Formats: CSV text (any
dialect, compressed or not; typed columns with missing cells), NPZ (`x`, `y`), MNIST IDX and
CIFAR-10 batches; plus synthetic teacher-network data."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..config.data import DataConfig, SyntheticData
from ..core import backend as B
from ..errors import DataError
from ..files import load_npz
from .arrow_csv import read_numeric
from .columns import RawColumns, is_missing
from .csv_reader import STDIN, CsvFormat, ReadBound, check_file, csv_header, detect, is_stream, iter_csv_chunks, \
    parse_cells, parse_rows
from .images import image_format, read_images


@dataclass
class Table:
    """Feature cells (numbers, NaN where missing or text; text columns aside), raw targets (labels
    or values, or None) and the feature columns' names."""
    raw: RawColumns
    y: np.ndarray | None
    features: list[str]
    source: str
    kept: dict[str, np.ndarray] = field(default_factory=dict)  # ReadSpec.keep columns, as text
    notes: list[str] = field(default_factory=list)  # what reading left out, said once

    @property
    def x(self) -> np.ndarray:
        return self.raw.x


@dataclass(frozen=True)
class ReadSpec:
    """What to read: the target and feature columns, and the CSV dialect and column types."""
    target: str | None = None
    features: list[str] | None = None
    need_target: bool = True
    data: DataConfig | None = None
    dtype: Any = None
    header: tuple[str, ...] | None = None  # headerless files: the columns
    keep: tuple[str, ...] = ()             # columns to carry through as text (predict --keep)

    @classmethod
    def of(cls, cfg: DataConfig, need_target: bool = True, features: list[str] | None = None) -> "ReadSpec":
        return cls(cfg.target, features or cfg.features, need_target, cfg, B.current().floatx,
                   tuple(cfg.names) if cfg.names else None)

    def csv_format(self, path: Path) -> CsvFormat:
        data = self.data
        return detect(path, data.delimiter if data else None, data.encoding if data else "utf-8", self.header)

    def wanted(self, names: list[str]) -> list[str]:
        if self.features:
            return list(self.features)
        ignored = {n for n in self._declared() if self.data.column_spec(n).type == "ignore"}
        return [n for n in names if n != self.target and n not in ignored]

    def text_columns(self, wanted: list[str]) -> set[int]:
        """Positions of the columns declared category or boolean: read as text from the start."""
        text = {n for n in self._declared() if self.data.column_spec(n).type in ("category", "boolean")}
        return {j for j, n in enumerate(wanted) if n in text}

    def _declared(self) -> list[str]:
        """The columns data.columns types (the others have no declared type: no lookup per column)."""
        return list(self.data.columns) if self.data is not None else []


# -- CSV -----------------------------------------------------------------------------------------
def _closest(name: str, names: list[str]) -> str:
    """'; did you mean ...?' for the column most like `name` (case first), or ''."""
    close = [n for n in names if n.lower() == name.lower()] or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


ARROW_MAX_COLUMNS = 10_000  # wider files go to the line reader: pyarrow keeps ~13 KiB per column (3 s at 100,000)
COLUMN_BYTES = 4096         # per feature column, before any row: names, parsing, fitted encoders, the model's
                            # inputs (a run of 1,000,000 columns x 2 rows peaked at 2.2 GiB; rounded up)


def _csv_columns(path: Path, spec: ReadSpec, fmt: CsvFormat) -> tuple[list[str], list[str]]:
    """The file's column names and the feature columns to read (checked against each other, and
    their count against the memory budget)."""
    names = csv_header(path, fmt)
    _check_width(path, names, spec)
    target = spec.target
    if spec.need_target:
        if target is None:
            raise DataError(f"{path}: data.target must name the target column; columns are {', '.join(names)}")
        if target not in names:
            raise DataError(f"{path}: no target column {target!r} (data.target){_closest(target, names)}; "
                            f"columns are {', '.join(names[:20])}")
    wanted = spec.wanted(names)
    present = set(names)
    missing = [f for f in wanted if f not in present]
    if missing:
        raise DataError(f"{path}: missing feature column(s) {', '.join(missing[:10])}"
                        + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
                        + f" (data.features){_closest(missing[0], names)}; the file has {', '.join(names[:20])}")
    if not wanted:
        raise DataError(f"{path}: no feature columns besides the target {target!r}")
    unknown = [c for c in (spec.data.columns if spec.data is not None else {}) if c not in present]
    if unknown and not spec.features:
        raise DataError(f"{path}: data.columns names {unknown[0]!r}, which is not a column of the file"
                        + (_closest(unknown[0], names) or f"; columns are {', '.join(names[:20])}"))
    absent = [k for k in spec.keep if k not in present]
    if absent:
        raise DataError(f"{path}: no column {absent[0]!r} to keep; columns are {', '.join(names[:20])}")
    return names, wanted


def _check_width(path: Path, names: list[str], spec: ReadSpec) -> None:
    """Refuse, before any per-column structure is built, more feature columns than the budget holds
    at COLUMN_BYTES each."""
    features = len(spec.features) if spec.features else len(names) - int(spec.target in names)
    need, budget = features * COLUMN_BYTES, B.host_memory_available()
    if budget is not None and need > budget:
        raise DataError(f"{path}: the header has {len(names):,} columns; reading {features:,} feature columns would "
                        f"take about {B.gib(need)} before any row ({COLUMN_BYTES // 1024} KiB per column); "
                        f"{B.budget_text(budget)}. Choose fewer columns (data.features), or use a machine with more "
                        "memory")


def whole_read(path: Path, spec: ReadSpec, features: int) -> ReadBound:
    """The bound of a table read whole: its rows, each of `features` numbers in the run's float type
    and a target label, counted against the memory budget as they are read."""
    target = TARGET_BYTES if spec.target and spec.need_target else 0
    return ReadBound(path, features * np.dtype(spec.dtype or B.current().floatx).itemsize + target, features)


TARGET_BYTES = 16  # a short label, as text then typed


def csv_chunks(path: Path, spec: ReadSpec, chunk_rows: int = 65536, whole: bool = False) -> Iterator[Table]:
    """The file's rows as Tables of at most `chunk_rows` rows (and about 8 Mi characters); `whole`:
    the caller keeps them all (`read_csv`), so their rows are counted against the memory budget."""
    fmt = spec.csv_format(path)
    names, wanted = _csv_columns(path, spec, fmt)
    position = {n: i for i, n in enumerate(names)}
    columns = [position[f] for f in wanted]
    text = spec.text_columns(wanted)
    dtype = spec.dtype or B.current().floatx
    target = spec.target if spec.target in position else None
    done = 0
    bound = whole_read(path, spec, len(wanted)) if whole else None
    for first_line, lines in iter_csv_chunks(path, chunk_rows, fmt, bound=bound):
        x, strings = parse_cells(lines, path, names, columns, first_line, fmt, dtype, text)
        y = parse_rows(lines, path, names, [position[target]], first_line, fmt, str)[:, 0] if target else None
        kept = parse_rows(lines, path, names, [position[k] for k in spec.keep], first_line, fmt, str) \
            if spec.keep else None
        yield Table(RawColumns(x, strings, np.arange(done, done + len(x))), y, wanted, str(path),
                    {k: kept[:, i] for i, k in enumerate(spec.keep)} if kept is not None else {})
        done += len(x)


def read_csv(path: Path, spec: ReadSpec, fast: bool = True) -> Table:
    """The whole file: numeric feature columns through pyarrow when it takes them, else (text
    columns, anything unusual, or `fast` off) the line reader, chunk by chunk."""
    if fast and not spec.keep:
        fmt = spec.csv_format(path)
        names, wanted = _csv_columns(path, spec, fmt)
        target = spec.target if spec.need_target else None
        dtype = spec.dtype or B.current().floatx
        arrow = read_numeric(path, fmt, wanted, target, dtype, whole_read(path, spec, len(wanted))) \
            if not spec.text_columns(wanted) and len(names) <= ARROW_MAX_COLUMNS else None
        if arrow is not None:
            x, y = arrow
            _check_finite(x, path, wanted)
            return _labelled(Table(RawColumns(x), y, wanted, str(path)), spec.target)
    parts = list(csv_chunks(path, spec, whole=True))
    if not parts:
        raise DataError(f"{path}: the CSV has a header but no data rows")
    text_cols = sorted({j for p in parts for j in p.raw.text})
    raw = RawColumns(np.concatenate([p.raw.x for p in parts]) if len(parts) > 1 else parts[0].raw.x,
                     {j: np.concatenate([p.raw.cells(j) for p in parts]) for j in text_cols})
    for j in text_cols:
        raw.x[:, j] = np.nan
    y = np.concatenate([p.y for p in parts]) if parts[0].y is not None and spec.need_target else None
    _check_finite(raw.x, path, parts[0].features)
    return _labelled(Table(raw, y, parts[0].features, str(path)), spec.target)


def _labelled(table: Table, target: str | None) -> Table:
    """The table without the rows whose target cell is missing (blank, NA, ?, ...: as in feature
    columns), a note naming them; targets typed."""
    if table.y is None:
        return table
    missing = is_missing(table.y)
    if missing.all():
        raise DataError(f"{table.source}: every row's target (column {target!r}) is missing (blank, NA, ?, ...); "
                        "is data.target the right column?")
    if missing.any():
        rows = np.flatnonzero(missing)
        shown = ", ".join(str(table.raw.row(int(r))) for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
        table.notes.append(f"{table.source}: {len(rows)} row(s) without a target (blank, NA, ?: data rows {shown}) "
                           "left out")
        kept = np.flatnonzero(~missing)
        table.raw, table.y = table.raw.rows(kept), table.y[kept]
        table.kept = {k: v[kept] for k, v in table.kept.items()}
    table.y = typed_labels(table.y)
    return table


def typed_labels(raw: np.ndarray) -> np.ndarray:
    """Targets as ints if they all are, else floats if they all are, else stripped strings."""
    raw = np.char.strip(raw.astype(str))
    for kind in (np.int64, np.float64):
        try:
            return raw.astype(kind)
        except (ValueError, OverflowError):
            continue
    return raw


def _check_finite(x: np.ndarray, source: Path | str, names: list[str]) -> None:
    """Missing cells are NaN (imputed later); infinities are refused."""
    bad = np.isinf(x)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise DataError(f"{source}: column {names[col]!r}, data row {row + 1}: non-finite value {x[row, col]} "
                        "(infinity); clean the data first")


# -- NPZ and images ------------------------------------------------------------------------------
def read_npz(path: Path, spec: ReadSpec) -> Table:
    check_file(path)
    f = load_npz(path, ".npz file", DataError, keys=("x", "y"))
    if "x" not in f or (spec.need_target and "y" not in f):
        with np.load(path, allow_pickle=False) as archive:  # just its names (read a moment ago)
            held = sorted(archive.files)
        raise DataError(f"{path}: expected arrays 'x' and 'y'; the file holds {held or 'nothing'}")
    x, y = f["x"], f.get("y")
    if x.dtype.kind not in "biuf":
        raise DataError(f"{path}: x must be numeric; received dtype {x.dtype}")
    if x.ndim < 2 or len(x) == 0:
        raise DataError(f"{path}: x must have shape (samples, features...); received {x.shape}")
    if y is not None and (y.ndim == 0 or len(y) != len(x)):
        raise DataError(f"{path}: x has {len(x)} rows but y has " + (f"{len(y)}" if y.ndim else "shape () (one value)")
                        + "; they must have one row per sample")
    with np.errstate(over="ignore"):  # a value beyond the float type becomes inf, refused just below by cell
        x = x.astype(spec.dtype or B.current().floatx)
    flat = x.reshape(len(x), -1)
    _check_finite(flat, path, [f"x[{i}]" for i in range(flat.shape[1])])
    return Table(RawColumns(x), y, [f"x{i}" for i in range(flat.shape[1])], str(path))


def read_image_set(path: Path, spec: ReadSpec) -> Table:
    x, y = read_images(path)
    return Table(RawColumns(x.astype(spec.dtype or B.current().floatx, copy=False)), y,
                 [f"pixel{i}" for i in range(int(np.prod(x.shape[1:])))], str(path))


# -- the registry --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reader:
    """One data format: how to recognise it, read it whole, and read it in chunks."""
    name: str
    matches: Callable[[Path], bool]
    read: Callable[[Path, ReadSpec], Table]
    chunks: Callable[[Path, ReadSpec, int], Iterator[Table]]


CSV_SUFFIXES = tuple(f"{kind}{packed}" for kind in (".csv", ".tsv", ".txt", ".data")
                     for packed in ("", ".gz", ".bz2", ".xz"))


def _whole(read: Callable[[Path, ReadSpec], Table]) -> Callable[[Path, ReadSpec, int], Iterator[Table]]:
    return lambda path, spec, rows: iter([read(path, spec)])


READERS = (
    Reader("images", lambda p: not is_stream(p) and p.exists() and image_format(p) is not None, read_image_set,
           _whole(read_image_set)),
    Reader("npz", lambda p: p.name.lower().endswith(".npz"), read_npz, _whole(read_npz)),
    Reader("csv", lambda p: str(p) == STDIN or is_stream(p) or p.name.lower().endswith(CSV_SUFFIXES), read_csv,
           csv_chunks),
)


def reader_for(path: Path) -> Reader:
    for reader in READERS:
        if reader.matches(path):
            return reader
    check_file(path)
    raise DataError(f"{path}: unknown data format; expected .csv, .tsv, .txt or .data (also .gz, .bz2, .xz), .npz, "
                    "MNIST *-idx3-ubyte[.gz] or CIFAR-10 batches (data_batch_*.bin, data_batch_*)")


def read_table(path: Path, spec: ReadSpec) -> Table:
    return reader_for(path).read(path, spec)


def synthetic(spec: SyntheticData, seed: int) -> Table:
    """Classification data labelled by a random teacher network (tanh hidden layer), plus noise."""
    B.require_memory(spec.samples * (spec.features * 12 + spec.classes * 16),
                     f"data.synthetic ({spec.samples:,} samples x {spec.features:,} features)", on_host=True)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(spec.samples, spec.features)).astype(B.current().floatx)
    w1 = rng.normal(size=(spec.features, spec.hidden)) / np.sqrt(spec.features)
    w2 = rng.normal(size=(spec.hidden, spec.classes)) / np.sqrt(spec.hidden)
    scores = np.tanh(x @ w1) @ w2 + spec.noise * rng.normal(size=(spec.samples, spec.classes))
    return Table(RawColumns(x), scores.argmax(axis=1), [f"x{i}" for i in range(spec.features)], "synthetic")
