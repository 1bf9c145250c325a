"""A table's cells before encoding, and reading them as their column's kind: missing cells (blank, NA
and the user's tokens), numbers, booleans, dates and category spellings, each unreadable cell named
by its data row (`UnreadableCells`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

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


def dates_in(cells: np.ndarray, raw: RawColumns, name: str, date_format: str, source: str,
             saved: bool = False) -> np.ndarray:
    """A date column's cells as seconds since 1970; a cell that holds no date is named."""
    values = dates.seconds(cells, date_format)
    if np.isnan(values).any():
        bad = raw.first(np.isnan(values))
        expected = f"a date written {date_format!r}" if date_format and saved else \
            f"a date in data.date_format {date_format!r}" if date_format else \
            "an ISO 8601 date or date-time, e.g. 2024-03-15 or 2024-03-15T14:30"
        fix = SAVED_FIX.format("dates so") if saved else " (data.date_format reads others)" * (not date_format)
        raise UnreadableCells(source, name, raw.row(bad),
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
