"""Numbers as spreadsheets write them: the decimal mark and the thousands separator (`3,5` for 3.5 and
`1.234,5` for 1234.5 in a European export). Declared by data.decimal / data.thousands, or detected
in a file not separated by commas whose number cells read only that way. Cells are respelled for
float() once per distinct value; a cell that does not follow the style is not a number."""

from __future__ import annotations

import csv
import re
from collections import Counter
from typing import Any

import numpy as np

from .. import signals
from .cells import is_missing, is_number



def _pattern(decimal: str, thousands: str) -> re.Pattern[str]:
    d, t = re.escape(decimal), re.escape(thousands) if thousands else None
    whole = rf"(\d{{1,3}}({t}\d{{3}})+|\d+)" if t else r"\d+"
    return re.compile(rf"[+-]?({whole}({d}\d*)?|{d}\d+)([eE][+-]?\d+)?")


def is_plain(decimal: str, thousands: str) -> bool:
    return decimal == "." and not thousands


def respelled(cells: np.ndarray, decimal: str, thousands: str) -> np.ndarray:
    """Stripped cells as float() reads them where they are numbers in this style; '?' (not a number)
    where they are not; cells are checked once per distinct value."""
    cells = np.char.strip(cells.astype(str))
    if is_plain(decimal, thousands) or not len(cells):
        return cells
    pattern = _pattern(decimal, thousands)
    uniques, inverse = np.unique(cells, return_inverse=True)
    spelled = [(u.replace(thousands, "") if thousands else u).replace(decimal, ".") if pattern.fullmatch(u) else "?"
               for u in uniques.tolist()]
    return np.asarray(spelled, dtype=str)[inverse.ravel()]


class OffStyle(ValueError):
    """A cell that reads as a number only in the plain style, in a column of numbers written in
    another ('12.5' among '1.234,5'): reading it as 12.5 would be a guess."""

    def __init__(self, row: int, cell: str) -> None:
        super().__init__(cell)
        self.row, self.cell, self.column = row, cell, 0


def styled_column(column: np.ndarray, present: np.ndarray, decimal: str, thousands: str) -> tuple[np.ndarray, bool]:
    """(the column's cells with its numbers respelled for float(), whether every present cell is a
    number); raises OffStyle for a plain-style number among numbers of this style."""
    spelled = np.where(present, respelled(column, decimal, thousands), "")
    off = present & (spelled == "?")
    if not off.any():
        return spelled, True
    plain = np.asarray([is_number(c) for c in column[off].tolist()])
    if plain.any() and (present & ~off).any():
        row = int(np.flatnonzero(off)[np.argmax(plain)])
        raise OffStyle(row, str(column[row]))
    return np.where(off, column, spelled), False


def respelled_labels(cells: np.ndarray, decimal: str, thousands: str) -> np.ndarray:
    """Target cells with their numbers respelled for float(); other labels as they are."""
    if is_plain(decimal, thousands):
        return cells
    spelled = respelled(cells, decimal, thousands)
    return np.where(spelled == "?", np.char.strip(cells.astype(str)), spelled)


def detect_style(lines: list[str], delimiter: str) -> tuple[str, str] | None:
    """How `lines` (a file's first ones) write numbers, where they show it; else None (the plain style).
    Separated by commas: (".", ",") when a quoted number cell groups its thousands with commas
    ('"31,543"', a spreadsheet's US export) and no cell reads only with a decimal comma ('3,5').
    Separated otherwise: (",", ".") when some number cell reads only with a decimal comma, and in each
    column with cells that read only with a decimal point ('2.5' is not 2,5's thousands grouping) the
    decimal commas are more (a '12.5' among '1.234,5's is then named by the reader, file and line)."""
    comma = _pattern(",", ".")
    rows = list(csv.reader(lines, delimiter=delimiter))
    cells = [c.strip() for row in rows for c in row]
    if delimiter == ",":
        grouped, with_commas = _pattern(".", ","), [c for c in cells if "," in c]
        decimal_commas = any(comma.fullmatch(c) and not grouped.fullmatch(c) for c in with_commas)
        return (".", ",") if any(grouped.fullmatch(c) for c in with_commas) and not decimal_commas else None
    commas, points = Counter(), Counter()  # per column: cells that read only with a decimal comma, a point
    for row in rows:
        for j, cell in enumerate(c.strip() for c in row):
            if "," in cell and comma.fullmatch(cell):
                commas[j] += 1
            elif "." in cell and is_number(cell) and not comma.fullmatch(cell):
                points[j] += 1
    if not commas or any(points[j] >= commas[j] for j in points):
        return None
    return (",", ".")


_GROUPS_OF_THREE = re.compile(r"[+-]?[1-9]\d{0,2}(\.\d{3})+")


def two_way_cells(lines: list[str], delimiter: str, shown: int = 3) -> list[str]:
    """Number cells of a ;-separated file (a European spreadsheet's export) that read two ways ('1.200':
    1.2, or 1200 with '.' between thousands) where no cell settles it: every cell with a '.' is digits
    in groups of three after a first digit, and none has a decimal comma (else `detect_style` decides).
    The first `shown` of them; none where the style is plain beyond doubt, or the file is separated
    otherwise (tab-separated measurements to 3 decimals are common, and plain)."""
    if delimiter != ";":
        return []
    cells = [c.strip() for row in csv.reader(lines, delimiter=delimiter) for c in row]
    dotted = [c for c in cells if "." in c and (is_number(c) or _GROUPS_OF_THREE.fullmatch(c))]
    if not dotted or any(not _GROUPS_OF_THREE.fullmatch(c) for c in dotted) or detect_style(lines, delimiter):
        return []
    return list(dict.fromkeys(dotted))[:shown]


def two_way_note(path: Any, cells: list[str]) -> str:
    """The warning for `two_way_cells`: how they are read, and the settings that read them otherwise."""
    first = cells[0]
    read = f"They are read as decimals ({first} = {float(first):g})" if is_number(first) else "They are read as text"
    return (f"{path}: number cells such as {', '.join(repr(c) for c in cells)} have three digits after every '.': "
            f"'.' may group thousands (a European export) or be a decimal point. {read}; if '.' groups thousands "
            f"({first} = {first.replace('.', '')}), set "
            "data.decimal: ',' and data.thousands: '.'; to keep decimals and drop this warning, set data.decimal: '.'")


def other_style_note(path: Any, seen: tuple[str, str] | None, decimal: str, thousands: str) -> str | None:
    """A warning for a file whose own lines write numbers in style `seen`, read in the declared (or
    the model's) style instead; None when they agree."""
    if seen is None or seen[0] == decimal:  # the same decimal mark: a grouping the file lacks changes nothing
        return None
    how = (lambda d, t: f"{d!r} as the decimal mark and {t!r} between thousands" if t else f"{d!r} as the decimal mark")  # noqa: E731  a one-line namer, local to this message
    return (f"{path}: its numbers look written with {how(*seen)}, but are read with {how(decimal, thousands)}, as "
            "data.decimal and data.thousands say (set in the config, or read off the training file and saved with "
            "the model); check the results, or write the file in that style")


def typed_cells(cells: np.ndarray, dtype: Any, text: set[int] = frozenset(), decimal: str = ".",
                thousands: str = "") -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Text cells (rows x columns) as numbers (NaN where missing: blank, NA, ?, ...) where every
    present cell of a column is one (written with this decimal mark and thousands separator), else
    (and for the positions in `text`) as text (missing: ''); OffStyle names a misfit number."""
    x = np.full(cells.shape, np.nan, dtype)
    strings = {}
    for j in range(cells.shape[1]):
        column = np.char.strip(cells[:, j])
        missing = is_missing(column)
        if j in text:
            strings[j] = np.where(missing, "", column)
        elif is_plain(decimal, thousands):
            try:
                with np.errstate(over="ignore"):  # beyond the float type: inf, refused by cell later
                    x[~missing, j] = column[~missing].astype(np.float64)
            except ValueError:
                signals.check()
                strings[j] = np.where(missing, "", column)
        else:
            _styled(column, missing, j, decimal, thousands, x, strings)
    return x, strings


def _styled(column: np.ndarray, missing: np.ndarray, j: int, decimal: str, thousands: str, x: np.ndarray,
            strings: dict[int, np.ndarray]) -> None:
    """Column j of numbers written in this style into x, or its cells (numbers respelled) into strings."""
    try:
        spelled, numbers = styled_column(column, ~missing, decimal, thousands)
    except OffStyle as exc:
        exc.column = j
        raise
    if numbers:
        with np.errstate(over="ignore"):
            x[~missing, j] = spelled[~missing].astype(np.float64)
    else:
        strings[j] = spelled
