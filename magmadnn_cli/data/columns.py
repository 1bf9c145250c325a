"""Feature columns as people's files hold them: numbers, categories (one-hot), booleans and missing
cells, typed (inferred or declared), fitted on the training rows only and stored with the model, so
evaluate and predict encode new rows exactly as training did (scikit-learn's ColumnTransformer with
SimpleImputer + MissingIndicator + OneHotEncoder, Ludwig's per-feature preprocessing)."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..config.data import ColumnSpec, DataConfig
from ..errors import DataError
from . import dates

MISSING = ("", "na", "n/a", "nan", "-nan", "null", "none", "nil", "?", "#n/a")
TRUE = ("true", "yes", "t", "y", "1", "1.0")
FALSE = ("false", "no", "f", "n", "0", "0.0")


def is_missing(cells: np.ndarray) -> np.ndarray:
    """Which text cells are missing values (blank, NA, N/A, NaN, null, None, nil, ?, #N/A)."""
    return np.isin(np.char.lower(np.char.strip(cells.astype(str))), MISSING)


@dataclass
class RawColumns:
    """A table's feature cells before encoding: `x` holds the numbers (NaN where missing or text),
    `text` the cells of text columns by position (missing cells as '')."""
    x: np.ndarray
    text: dict[int, np.ndarray] = field(default_factory=dict)
    row_ids: np.ndarray | None = None  # each row's place among the file's data rows (default: its index)

    def rows(self, index: np.ndarray) -> "RawColumns":
        ids = self.row_ids[index] if self.row_ids is not None else np.asarray(index)
        return RawColumns(self.x[index], {j: v[index] for j, v in self.text.items()}, ids)

    def row(self, i: int) -> int:
        """The 1-based data row number of row i (for messages)."""
        return int(self.row_ids[i] if self.row_ids is not None else i) + 1

    def first(self, mask: np.ndarray) -> int:
        """Of the rows in `mask`, the one that comes first in the file."""
        rows = np.flatnonzero(mask)
        return int(rows[np.argmin(self.row_ids[rows])] if self.row_ids is not None else rows[0])

    def cells(self, j: int) -> np.ndarray:
        """Column j as text (numbers in their shortest form), missing cells as ''."""
        if j in self.text:
            return self.text[j]
        return np.array(["" if np.isnan(v) else np.format_float_positional(v, trim="-") for v in self.x[:, j]])


@dataclass
class Column:
    """One fitted feature column: its kind, the value that fills its missing cells, whether a 0/1
    missing-indicator column follows it, and (categories) the one-hot vocabulary."""
    name: str
    kind: str                      # number | category | boolean | date
    fill: Any = 0.0
    indicator: bool = False
    categories: list[str] = field(default_factory=list)
    time_of_day: bool = False      # a date column whose training cells hold times
    date_format: str = ""          # strptime codes of a date column ('': ISO 8601)

    @property
    def width(self) -> int:
        return len(self.values()) + int(self.indicator)

    def values(self) -> list[str]:
        """The names of the columns its values encode into (before a missing indicator)."""
        if self.kind == "category":
            return [f"{self.name}={c}" for c in self.categories]
        if self.kind == "date":
            return [f"{self.name}.{part}" for part in dates.PARTS + ("hour",) * self.time_of_day]
        return [self.name]

    def output_names(self) -> list[str]:
        return self.values() + ([f"{self.name}_missing"] if self.indicator else [])

    def numbers(self) -> list[bool]:
        """Which of its output columns are numbers (the ones input normalization scales)."""
        scaled = self.kind in ("number", "date")
        return [scaled] * len(self.values()) + [False] * int(self.indicator)


@dataclass
class ColumnEncoder:
    """Raw feature columns -> one float matrix (numbers imputed, categories one-hot, booleans 0/1,
    optional missing indicators). `unseen` decides what an unknown category does."""
    columns: list[Column]
    unseen: str = "ignore"

    @property
    def width(self) -> int:
        return sum(c.width for c in self.columns)

    @property
    def identity(self) -> bool:
        """Numbers only, no indicators: the encoding only fills missing cells."""
        return all(c.kind == "number" and not c.indicator for c in self.columns)

    def number_mask(self) -> np.ndarray:
        """Which output columns are numbers (the ones input normalization scales)."""
        return np.array([flag for c in self.columns for flag in c.numbers()], dtype=bool)

    def output_names(self) -> list[str]:
        return [n for c in self.columns for n in c.output_names()]

    def transform(self, raw: RawColumns, source: str, strict: bool = False) -> tuple[np.ndarray, dict[str, int]]:
        """The encoded matrix (raw.x's dtype) and, per column, how many cells held a category not
        seen in training (all-zero rows; an error when `strict` or unseen: error)."""
        x = raw.x
        if self.identity and not raw.text:
            missing = np.isnan(x)
            if missing.any():
                fills = np.array([c.fill for c in self.columns], dtype=x.dtype)
                x = np.where(missing, fills, x)
            return x, {}
        parts, unseen = [], {}
        for j, col in enumerate(self.columns):
            block, count = _encode(col, raw, j, x.dtype, source, strict or self.unseen == "error")
            parts.append(block)
            if count:
                unseen[col.name] = count
        return np.concatenate(parts, axis=1) if parts else np.zeros((len(x), 0), x.dtype), unseen

    def to_json(self) -> dict[str, Any]:
        return {"unseen": self.unseen, "columns": [asdict(c) for c in self.columns]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ColumnEncoder":
        return cls([Column(**c) for c in data["columns"]], data.get("unseen", "ignore"))


def _encode(col: Column, raw: RawColumns, j: int, dtype: Any, source: str, strict: bool) -> tuple[np.ndarray, int]:
    if col.kind == "number":
        values = raw.x[:, j] if j not in raw.text else _numbers(raw, j, col.name, source)
        missing = np.isnan(values)
        block = np.where(missing, np.dtype(dtype).type(col.fill), values)[:, None].astype(dtype, copy=False)
        return _with_indicator(block, missing, col.indicator), 0
    cells = raw.cells(j)
    missing = is_missing(cells)
    if col.kind == "date":
        values = _dates(np.where(missing, col.fill, cells), raw, col, source)
        return _with_indicator(dates.features(values, col.time_of_day, np.dtype(dtype)), missing, col.indicator), 0
    if col.kind == "boolean":
        flags = _booleans(np.where(missing, str(col.fill), cells), raw, col.name, source)
        return _with_indicator(flags[:, None].astype(dtype), missing, col.indicator), 0
    cells = np.where(missing, str(col.fill), canonical(cells))
    index = {c: i for i, c in enumerate(col.categories)}
    uniques, inverse = np.unique(cells, return_inverse=True)
    codes = np.array([index.get(u, -1) for u in uniques], dtype=np.int64)[inverse.ravel()]
    unknown = int((codes < 0).sum())
    if unknown and strict:
        row = raw.first(codes < 0)
        raise DataError(f"{source}: column {col.name!r}, data row {raw.row(row)}: category {str(cells[row])!r} was not in the "
                        f"training data (known: {', '.join(col.categories[:12])}); unseen categories are refused "
                        "(data.unseen_categories: ignore encodes them as all zeros)")
    block = (codes[:, None] == np.arange(len(col.categories))[None, :]).astype(dtype)
    return _with_indicator(block, missing, col.indicator), unknown


def _with_indicator(block: np.ndarray, missing: np.ndarray, indicator: bool) -> np.ndarray:
    return np.concatenate([block, missing[:, None].astype(block.dtype)], axis=1) if indicator else block


def canonical(cells: np.ndarray) -> np.ndarray:
    """Category values as one spelling: stripped, and numbers in their shortest form ('1.0' and
    '01' are the category '1'), so a code column reads the same from any file."""
    cells = np.char.strip(cells.astype(str))
    uniques, inverse = np.unique(cells, return_inverse=True)
    spelled = [_shortest(u) for u in uniques]
    return np.array(spelled, dtype=object)[inverse.ravel()].astype(str) if len(cells) else cells


def _shortest(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return text
    return np.format_float_positional(np.float32(value), trim="-") if np.isfinite(value) else text


def _numbers(raw: RawColumns, j: int, name: str, source: str) -> np.ndarray:
    cells = raw.text[j]
    missing = is_missing(cells)
    values = np.full(len(cells), np.nan)
    try:
        values[~missing] = np.char.strip(cells[~missing].astype(str)).astype(np.float64)
    except ValueError:
        texts = [u for u in np.unique(cells[~missing]) if not _is_number(str(u))]
        bad = raw.first(np.isin(cells, texts) & ~missing)
        raise DataError(f"{source}: column {name!r}, data row {raw.row(bad)}: {str(cells[bad])!r} is not a number "
                        f"(the column holds numbers: typed so, or so in the training rows); fix the cell, or type "
                        f"the column category (data.columns.{name}: category)") from None
    return values


def _dates(cells: np.ndarray, raw: RawColumns, col: Column, source: str) -> np.ndarray:
    """A date column's cells as seconds since 1970; a cell that holds no date is named."""
    values = dates.seconds(cells, col.date_format)
    if np.isnan(values).any():
        bad = raw.first(np.isnan(values))
        expected = f"a date in data.date_format {col.date_format!r}" if col.date_format else \
            "an ISO 8601 date or date-time, e.g. 2024-03-15 or 2024-03-15T14:30 (data.date_format reads others)"
        raise DataError(f"{source}: column {col.name!r}, data row {raw.row(bad)}: {str(cells[bad])!r} is not a date; "
                        f"expected {expected}")
    return values


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _booleans(cells: np.ndarray, raw: RawColumns, name: str, source: str) -> np.ndarray:
    lowered = np.char.lower(np.char.strip(cells.astype(str)))
    true, false = np.isin(lowered, TRUE), np.isin(lowered, FALSE)
    if not (true | false).all():
        bad = raw.first(~(true | false))
        raise DataError(f"{source}: column {name!r}, data row {raw.row(bad)}: {str(cells[bad])!r} is not a boolean "
                        "(true/false, yes/no, t/f, y/n, 1/0); type the column category instead")
    return true


# -- fitting -------------------------------------------------------------------------------------
def fit(raw: RawColumns, names: list[str], cfg: DataConfig, source: str) -> tuple[ColumnEncoder, list[str]]:
    """Type, fill and vocabulary of every column from the training rows; returns the encoder and
    what was inferred or imputed by default (a line each, said once in the run log)."""
    medians = _medians(raw.x)
    columns, inferred, imputed = [], [], {}
    declared, undeclared = {name: cfg.column_spec(name) for name in cfg.columns}, ColumnSpec()  # once, not per column
    for j, name in enumerate(names):
        spec = declared.get(name, undeclared)
        column, missing = _fit_column(raw, j, name, cfg, spec, medians[j], source)
        if spec.type is None and column.kind != "number":
            inferred.append(f"{name} ({column.kind}" + (f", {len(column.categories)} values)" if column.kind == "category"
                                                        else f": {', '.join(column.values())})" if column.kind == "date"
                                                        else ")"))
        if missing and spec.missing is None and cfg.missing_values == "auto":
            how = {"number": "median", "date": "median date"}.get(column.kind, "most frequent value")
            imputed.setdefault(how, []).append(f"{name} ({missing})")
        columns.append(column)
    notes = [f"text columns read as categories (one-hot), booleans or dates: {', '.join(inferred)}; set "
             "data.columns.<name> to type them yourself"] if inferred else []
    notes += [f"missing cells filled with the training rows' {how}: {', '.join(cols)} (data.missing_values; "
              "data.missing_indicator adds 0/1 columns)" for how, cols in imputed.items()]
    return ColumnEncoder(columns, cfg.unseen_categories), notes


def _fit_column(raw: RawColumns, j: int, name: str, cfg: DataConfig, spec: ColumnSpec, median: float,
                source: str) -> tuple[Column, int]:
    """One column fitted (`spec`: its data.columns entry), and how many of its training cells were missing."""
    kind = spec.type or _inferred(raw, j, name, source, cfg.date_format or "")
    missing = np.isnan(raw.x[:, j]) if j not in raw.text else is_missing(raw.text[j])
    strategy = spec.missing or cfg.missing_values
    if missing.any() and strategy == "error":
        raise DataError(f"{source}: column {name!r}, data row {raw.row(raw.first(missing))}: a missing cell, and "
                        "data.missing_values is error; fill the data, or choose median, mean, most_frequent or constant")
    indicator = spec.indicator if spec.indicator is not None else cfg.missing_indicator and missing.any()
    column = Column(name, kind, indicator=bool(indicator), date_format=cfg.date_format or "" if kind == "date" else "")
    if kind == "date":
        return _fit_date(column, raw, j, missing, strategy, spec.fill_value, source), int(missing.sum())
    fast_median = kind == "number" and strategy in ("auto", "median") and j not in raw.text
    column.fill = median if fast_median else _fill(column, raw, j, missing, strategy, spec.fill_value, source)
    if kind == "category":
        present = set(canonical(raw.cells(j)[~missing]).tolist())
        column.categories = sorted(present | ({str(column.fill)} if missing.any() else set()))
    return column, int(missing.sum())


def _fit_date(column: Column, raw: RawColumns, j: int, missing: np.ndarray, strategy: str, constant: Any,
              source: str) -> Column:
    """A date column's fill (the training dates' median, mean, most frequent or the constant) and
    whether its cells hold times of day."""
    present = _dates(raw.cells(j)[~missing], raw.rows(np.flatnonzero(~missing)), column, source)
    column.time_of_day = dates.has_time(present)
    if strategy == "constant":
        value = dates.parse(str(constant), column.date_format)
        if value is None:
            raise DataError(f"data.columns.{column.name}.fill_value: {constant!r} is not a date (the column holds dates)")
        column.fill = str(constant)
    elif strategy == "most_frequent" and present.size:
        uniques, counts = np.unique(present, return_counts=True)
        column.fill = dates.iso(float(uniques[counts.argmax()]))
    elif present.size:
        column.fill = dates.iso(float(present.mean() if strategy == "mean" else np.median(present)))
    else:
        column.fill = dates.iso(0.0)
    if column.date_format and strategy != "constant":  # the fill is parsed like a cell of the column
        column.fill = dates.EPOCH.fromisoformat(column.fill).strftime(column.date_format)
    return column


def _medians(x: np.ndarray) -> list[float]:
    """Every column's median over its present cells (0 where none is present), in one pass."""
    if not len(x):
        return [0.0] * x.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-missing column
        values = np.nanmedian(x, axis=0) if np.isnan(x).any() else np.median(x, axis=0)
    return [float(v) if np.isfinite(v) else 0.0 for v in values]


def _inferred(raw: RawColumns, j: int, name: str, source: str, date_format: str = "") -> str:
    """number unless a cell is text; date when every text value is a date (ISO 8601, or in
    data.date_format); boolean when every one is true/false, yes/no, ...; a column of numbers with a
    few stray text cells (typos) is refused, not read as categories."""
    if j not in raw.text:
        return "number"
    cells = raw.text[j]
    present = ~is_missing(cells)
    values = np.unique(cells[present])
    if dates.all_dates(values, date_format):
        return "date"
    if len(values) and np.isin(np.char.lower(np.char.strip(values.astype(str))), TRUE + FALSE).all():
        return "boolean"
    return _category_unless_numbers(raw, j, name, source, present, values)


def _category_unless_numbers(raw: RawColumns, j: int, name: str, source: str, present: np.ndarray,
                             values: np.ndarray, share: float = 0.9) -> str:
    """category; number when every present training cell is one (the text is in other rows, which
    then name their cell); refused when at least `share` of them are (the text cells are typos)."""
    cells = raw.text[j]
    numeric = np.isin(cells, [v for v in values if _is_number(str(v))]) & present
    count, total = int(numeric.sum()), int(present.sum())
    if not total or count < share * total:
        return _category_unless_identifier(name, source, total, values)
    if count == total:
        return "number"
    bad = raw.first(present & ~numeric)
    raise DataError(f"{source}: column {name!r}, data row {raw.row(bad)}: {str(cells[bad])!r} is not a number, while "
                    f"{count} of its {total} present cells in the training rows are; fix the cell (or leave it blank: "
                    f"a missing cell), or read the column's values as categories (data.columns.{name}: category)")


def _category_unless_identifier(name: str, source: str, present: int, values: np.ndarray, rows: int = 20) -> str:
    """category, unless each of at least `rows` present training cells is a different value: an ID,
    whose one-hot columns (one per row) no new row would match."""
    if present < rows or len(values) < present:
        return "category"
    shown = ", ".join(str(v) for v in values[:3])
    raise DataError(f"{source}: column {name!r} looks like an identifier: each of its {present} present training "
                    f"cells is a different value ({shown}, ...), so as categories it would add {present} inputs that "
                    f"no new row matches; leave it out (data.columns.{name}: ignore), or keep it as categories if "
                    f"its values do repeat in new data (data.columns.{name}: category)")


def _fill(column: Column, raw: RawColumns, j: int, missing: np.ndarray, strategy: str, constant: Any,
          source: str) -> Any:
    """The value for missing cells, from the training rows' present ones."""
    if strategy == "constant":
        if column.kind == "number" and not _is_number(str(constant)):
            raise DataError(f"data.columns.{column.name}.fill_value: {constant!r} is not a number (the column is "
                            "typed number)")
        return float(constant) if column.kind == "number" else _shortest(str(constant))
    if column.kind == "number":
        values = raw.x[:, j] if j not in raw.text else _numbers(raw, j, column.name, source)
        present = values[~np.isnan(values)]
        if strategy == "mean" and present.size:
            return float(present.mean())
        if strategy == "most_frequent" and present.size:
            uniques, counts = np.unique(present, return_counts=True)
            return float(uniques[counts.argmax()])
        return float(np.median(present)) if present.size else 0.0
    if strategy in ("mean", "median"):
        raise DataError(f"data.columns.{column.name}: missing: {strategy} needs numbers; the column is a "
                        f"{column.kind}: use most_frequent or constant")
    cells = raw.cells(j)
    if column.kind == "boolean":
        flags = _booleans(np.where(missing, "false", cells), raw, column.name, source)[~missing]
        return "true" if flags.sum() * 2 >= len(flags) and len(flags) else "false"
    counts = Counter(canonical(cells[~missing]).tolist())
    return min(counts, key=lambda c: (-counts[c], c)) if counts else "missing"
