"""Feature columns as people's files hold them: numbers, categories (one-hot), booleans, dates and
missing cells, encoded as fitted on the training rows (`fitting.py`) and stored with the model, so
evaluate and predict encode new rows exactly as training did (scikit-learn's ColumnTransformer with
SimpleImputer + MissingIndicator + OneHotEncoder, Ludwig's per-feature preprocessing)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import DataError
from . import dates

MISSING = ("", "na", "n/a", "nan", "-nan", "null", "none", "nil", "?", "#n/a")
TRUE = ("true", "yes", "t", "y", "1", "1.0")
FALSE = ("false", "no", "f", "n", "0", "0.0")


def is_missing(cells: np.ndarray, words: Sequence[str] = MISSING) -> np.ndarray:
    """Which text cells are missing values (blank, NA, N/A, NaN, null, None, nil, ?, #N/A; or `words`,
    in lower case), compared without case and surrounding spaces."""
    return np.isin(np.char.lower(np.char.strip(cells.astype(str))), words)


@dataclass(frozen=True)
class MissingTokens:
    """A user's `data.missing_tokens`: the words (lower case) and the numbers among them (-999 is
    missing as the number -999.0 too, in a column read as numbers)."""
    words: tuple[str, ...] = ()
    numbers: tuple[float, ...] = ()

    @classmethod
    def of(cls, tokens: Sequence[str]) -> "MissingTokens":
        words = tuple(dict.fromkeys(t.strip().lower() for t in tokens))
        numbers = (number_of(w) for w in words)
        return cls(words, tuple(n for n in numbers if n is not None and np.isfinite(n)))

    def blank(self, cells: np.ndarray) -> np.ndarray:
        """Text cells with the tokens (and numbers equal to a number token) as blank cells."""
        uniques, inverse = np.unique(cells.astype(str), return_inverse=True)
        hit = is_missing(uniques, self.words)
        if self.numbers:
            hit |= np.array([number_of(u) in self.numbers for u in uniques], dtype=bool)
        if not hit.any():
            return cells
        cells = cells.copy()
        cells[hit[inverse.ravel()]] = ""
        return cells

    def nan(self, x: np.ndarray) -> None:
        """Numbers equal to a number token as NaN (missing), in place."""
        if self.numbers and x.size:
            x[np.isin(x, np.array(self.numbers, dtype=x.dtype))] = np.nan


class UnreadableCells(DataError):
    """Cells of one column that its type cannot read, named from the first (`row`, 1-based): the
    encoder reports every column's at once, in the order of their first rows."""

    def __init__(self, source: str, name: str, row: int, what: str) -> None:
        super().__init__(f"{source}: column {name!r}, data row {row}: {what}")
        self.source, self.name, self.row, self.what = source, name, row, what

    @staticmethod
    def combined(errors: list["UnreadableCells"]) -> DataError:
        if len(errors) == 1:
            return errors[0]
        lines = [f"  column {e.name!r}, data row {e.row}: {e.what}" for e in sorted(errors, key=lambda e: e.row)]
        return DataError(f"{errors[0].source}: {len(errors)} columns hold cells that cannot be read (each from its "
                         "first row):\n" + "\n".join(lines))


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
    kind: str                      # number | category | boolean | date | constant (dropped: one value in training)
    fill: Any = 0.0
    indicator: bool = False
    categories: list[str] = field(default_factory=list)
    time_of_day: bool = False      # a date column whose training cells hold times
    date_format: str = ""          # strptime codes of a date column ('': ISO 8601)
    embedding: int = 0             # a category column encoded as its code (-1: unseen), for an embedding this wide

    @property
    def width(self) -> int:
        return len(self.values()) + int(self.indicator)

    def values(self) -> list[str]:
        """The names of the columns its values encode into (before a missing indicator)."""
        if self.kind == "category":
            return [f"{self.name}#code"] if self.embedding else [f"{self.name}={c}" for c in self.categories]
        if self.kind == "date":
            return [f"{self.name}.{part}" for part in dates.PARTS + ("hour",) * self.time_of_day]
        return [] if self.kind == "constant" else [self.name]

    def output_names(self) -> list[str]:
        return self.values() + ([f"{self.name}_missing"] if self.indicator else [])

    def numbers(self) -> list[bool]:
        """Which of its output columns are numbers (the ones input normalization scales)."""
        scaled = self.kind in ("number", "date")
        return [scaled] * len(self.values()) + [False] * int(self.indicator)


@dataclass(frozen=True)
class Embedded:
    """A category column the network embeds: its code's place in the encoded row, its categories
    (the table's rows) and the vector's width."""
    name: str
    position: int
    vocabulary: int
    width: int


@dataclass
class ColumnEncoder:
    """Raw feature columns -> one float matrix (numbers imputed, categories one-hot, booleans 0/1,
    optional missing indicators). `unseen` decides what an unknown category does."""
    columns: list[Column]
    unseen: str = "ignore"
    saved: bool = False  # a saved model's (from_json): its bad cells can only be fixed, not retyped

    @property
    def width(self) -> int:
        return sum(c.width for c in self.columns)

    @property
    def identity(self) -> bool:
        """Numbers only (constant columns aside), no indicators: the encoding fills missing cells
        and leaves the constant columns out."""
        return all(c.kind in ("number", "constant") and not c.indicator for c in self.columns)

    def number_mask(self) -> np.ndarray:
        """Which output columns are numbers (the ones input normalization scales)."""
        return np.array([flag for c in self.columns for flag in c.numbers()], dtype=bool)

    def output_names(self) -> list[str]:
        return [n for c in self.columns for n in c.output_names()]

    def embedded(self) -> list["Embedded"]:
        """The columns encoded as category codes for an embedding, with their places in the encoded row."""
        found, position = [], 0
        for c in self.columns:
            if c.embedding:
                found.append(Embedded(c.name, position, len(c.categories), c.embedding))
            position += c.width
        return found

    def missing(self, raw: RawColumns) -> dict[str, np.ndarray]:
        """Per input column holding any, the mask of the missing cells `transform` fills."""
        masks = {}
        for j, col in enumerate(self.columns):
            mask = is_missing(raw.text[j]) if j in raw.text else np.isnan(raw.x[:, j])
            if col.kind != "constant" and mask.any():
                masks[col.name] = mask
        return masks

    def transform(self, raw: RawColumns, source: str, strict: bool = False) -> tuple[np.ndarray, dict[str, Counter]]:
        """The encoded matrix (raw.x's dtype) and, per column, the cells that held a category not seen
        in training, counted by value (all-zero rows; an error when `strict` or unseen: error)."""
        x = raw.x
        if self.identity and not raw.text:
            kept = [j for j, c in enumerate(self.columns) if c.kind == "number"]
            x = x[:, kept] if len(kept) < len(self.columns) else x
            missing = np.isnan(x)
            if missing.any():
                fills = np.array([self.columns[j].fill for j in kept], dtype=x.dtype)
                x = np.where(missing, fills, x)
            return x, {}
        parts, unseen, unreadable = [], {}, []
        for j, col in enumerate(self.columns):
            try:
                block, count = _encode(col, raw, j, x.dtype, source, self._refusal(strict), self.saved)
            except UnreadableCells as exc:
                unreadable.append(exc)
                continue
            parts.append(block)
            if count:
                unseen[col.name] = count
        if unreadable:
            raise UnreadableCells.combined(unreadable)
        return np.concatenate(parts, axis=1) if parts else np.zeros((len(x), 0), x.dtype), unseen

    def _refusal(self, strict: bool) -> str | None:
        """What refuses unseen categories, and how to encode them instead (None: they are encoded)."""
        if self.unseen == "error":  # the model's own setting: refused with or without --strict
            return "the model was trained with data.unseen_categories: error, which refuses them"
        if strict:
            return "--strict refuses them (without it they are encoded as all zeros, and counted)"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"unseen": self.unseen, "columns": [asdict(c) for c in self.columns]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ColumnEncoder":
        return cls([Column(**c) for c in data["columns"]], data.get("unseen", "ignore"), saved=True)


def _encode(col: Column, raw: RawColumns, j: int, dtype: Any, source: str, refusal: str | None,
            saved: bool) -> tuple[np.ndarray, Counter]:
    """The column's block, and its cells of categories unseen in training, by value (none but in a
    category column); `refusal`: what refuses unseen categories (None: encoded as all zeros)."""
    if col.kind == "constant":
        return np.zeros((len(raw.x), 0), dtype), Counter()
    if col.kind == "number":
        values = raw.x[:, j] if j not in raw.text else numbers_in(raw, j, col.name, source, saved)
        missing = np.isnan(values)
        block = np.where(missing, np.dtype(dtype).type(col.fill), values)[:, None].astype(dtype, copy=False)
        return _with_indicator(block, missing, col.indicator), Counter()
    cells = raw.cells(j)
    missing = is_missing(cells)
    if col.kind == "date":
        values = dates_in(np.where(missing, col.fill, cells), raw, col, source, saved)
        block = dates.features(values, col.time_of_day, np.dtype(dtype))
        return _with_indicator(block, missing, col.indicator), Counter()
    if col.kind == "boolean":
        flags = booleans_in(np.where(missing, str(col.fill), cells), raw, col.name, source, saved)
        return _with_indicator(flags[:, None].astype(dtype), missing, col.indicator), Counter()
    cells = np.where(missing, str(col.fill), canonical(cells))
    index = {c: i for i, c in enumerate(col.categories)}
    uniques, inverse, counts = np.unique(cells, return_inverse=True, return_counts=True)
    unique_codes = np.array([index.get(u, -1) for u in uniques], dtype=np.int64)
    codes = unique_codes[inverse.ravel()]
    unknown = Counter({str(u): int(n) for u, n, code in zip(uniques, counts, unique_codes) if code < 0})
    if unknown and refusal:
        row = raw.first(codes < 0)
        raise DataError(f"{source}: column {col.name!r}, data row {raw.row(row)}: category {str(cells[row])!r} was not in the "
                        f"training data (known: {', '.join(map(repr, col.categories[:12]))}); {refusal}")
    block = codes[:, None].astype(dtype) if col.embedding else \
        (codes[:, None] == np.arange(len(col.categories))[None, :]).astype(dtype)
    return _with_indicator(block, missing, col.indicator), unknown


def _with_indicator(block: np.ndarray, missing: np.ndarray, indicator: bool) -> np.ndarray:
    return np.concatenate([block, missing[:, None].astype(block.dtype)], axis=1) if indicator else block


def canonical(cells: np.ndarray) -> np.ndarray:
    """Category values as one spelling: stripped, and numbers in their shortest form ('1.0' and
    '01' are the category '1'), so a code column reads the same from any file."""
    cells = np.char.strip(cells.astype(str))
    uniques, inverse = np.unique(cells, return_inverse=True)
    spelled = [shortest(u) for u in uniques]
    return np.array(spelled, dtype=object)[inverse.ravel()].astype(str) if len(cells) else cells


def shortest(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return text
    with np.errstate(over="ignore"):  # beyond float32: 'inf', a code no category has
        return np.format_float_positional(np.float32(value), trim="-") if np.isfinite(value) else text


SAVED_FIX = "; the model reads this column as {} (as it was trained): fix the cell"


def numbers_in(raw: RawColumns, j: int, name: str, source: str, saved: bool = False) -> np.ndarray:
    cells = raw.text[j]
    missing = is_missing(cells)
    values = np.full(len(cells), np.nan)
    try:
        values[~missing] = np.char.strip(cells[~missing].astype(str)).astype(np.float64)
    except ValueError:
        texts = [u for u in np.unique(cells[~missing]) if not is_number(str(u))]
        stray = np.isin(cells, texts) & ~missing
        bad = raw.first(stray)
        fix = SAVED_FIX.format("numbers") if saved else (
            f" (the column holds numbers: typed so, or so in the training rows); fix the cell, or type the column "
            f"category (data.columns.{name}: category)")
        others = f" ({stray.sum()} such cells: {stray_cells(raw, cells, stray)})" if stray.sum() > 1 else ""
        raise UnreadableCells(source, name, raw.row(bad), f"{str(cells[bad])!r} is not a number{others}{fix}") from None
    return values


def dates_in(cells: np.ndarray, raw: RawColumns, col: Column, source: str, saved: bool = False) -> np.ndarray:
    """A date column's cells as seconds since 1970; a cell that holds no date is named."""
    values = dates.seconds(cells, col.date_format)
    if np.isnan(values).any():
        bad = raw.first(np.isnan(values))
        expected = f"a date written {col.date_format!r}" if col.date_format and saved else \
            f"a date in data.date_format {col.date_format!r}" if col.date_format else \
            "an ISO 8601 date or date-time, e.g. 2024-03-15 or 2024-03-15T14:30"
        fix = SAVED_FIX.format("dates so") if saved else " (data.date_format reads others)" * (not col.date_format)
        raise UnreadableCells(source, col.name, raw.row(bad),
                              f"{str(cells[bad])!r} is not a date; expected {expected}{fix}")
    return values


def number_of(text: str) -> float | None:
    """The number a cell's text is, as float() reads it (None: not a number)."""
    try:
        return float(text)
    except ValueError:
        return None


def is_number(text: str) -> bool:
    return number_of(text) is not None


def booleans_in(cells: np.ndarray, raw: RawColumns, name: str, source: str, saved: bool = False) -> np.ndarray:
    lowered = np.char.lower(np.char.strip(cells.astype(str)))
    true, false = np.isin(lowered, TRUE), np.isin(lowered, FALSE)
    if not (true | false).all():
        bad = raw.first(~(true | false))
        fix = SAVED_FIX.format("booleans") if saved else "; type the column category instead"
        raise UnreadableCells(source, name, raw.row(bad),
                              f"{str(cells[bad])!r} is not a boolean (true/false, yes/no, t/f, y/n, 1/0){fix}")
    return true


def spellings(cells: np.ndarray) -> tuple[list[str], list[str]]:
    """A boolean column's present cells as written (stripped): its true words and its false words,
    each by how often it occurs (the most frequent first)."""
    texts = np.char.strip(cells[~is_missing(cells)].astype(str))
    words, counts = np.unique(texts, return_counts=True)
    ordered = [str(w) for w in words[np.argsort(-counts, kind="stable")]]
    return [w for w in ordered if w.lower() in TRUE], [w for w in ordered if w.lower() in FALSE]


def said_as_written(cells: np.ndarray) -> str:
    """'yes/no' (or 'Y, yes/N, no'): a boolean column's words as its cells write them."""
    true, false = spellings(cells)
    return f"{', '.join(true) or 'true'}/{', '.join(false) or 'false'}"


def stray_cells(raw: RawColumns, cells: np.ndarray, mask: np.ndarray, most: int = 5) -> str:
    """The distinct values of the cells in `mask`, in the order of their first rows in the file, each
    with its count and first rows (at most `most` values): every fix a user needs, named at once."""
    rows = np.flatnonzero(mask)
    order = rows[np.argsort(raw.row_ids[rows], kind="stable")] if raw.row_ids is not None else rows
    values, first, inverse, counts = np.unique(cells[order], return_index=True, return_inverse=True,
                                               return_counts=True)
    described = []
    for k in np.argsort(first, kind="stable")[:most]:
        at = [raw.row(int(i)) for i in order[inverse.ravel() == k][:3]]
        where = ", ".join(map(str, at)) + (", ..." if counts[k] > 3 else "")
        described.append(f"{str(values[k])!r} ({counts[k]}: data row{'s' if counts[k] > 1 else ''} {where})")
    return ", ".join(described) + (f", and {len(values) - most} more value(s)" if len(values) > most else "")


def refuse_duplicate_names(source: Path | str, names: list[str], where: str, fix: str) -> None:
    """Columns of one name twice (a reader could select neither) refused, naming them (linear in the
    column count): `where` they were found ("the header", "the schema"), and `fix`."""
    duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
    if duplicates:
        raise DataError(f"{source}: duplicate column names in {where}: {', '.join(map(repr, duplicates[:20]))}; {fix}")
