"""Fitting the feature columns on the training rows: each column's type (declared, or inferred from
its cells: numbers, dates, booleans, categories; an identifier or a column of numbers with stray text
refused), the value for its missing cells, its categories, and the constant columns left out."""

from __future__ import annotations

import re
import warnings

import numpy as np

from ..config.column_kinds import kind_named
from ..config.data import ColumnSpec, DataConfig
from ..errors import DataError
from . import dates
from .classes import category_twins
from .cells import RawColumns, UnreadableCells, canonical, is_missing, is_number, stray_cells
from .column_kinds import INFERRED, Training, own_missing_category, present_categories
from .columns import Column, ColumnEncoder


def fit(raw: RawColumns, names: list[str], cfg: DataConfig, source: str) -> tuple[ColumnEncoder, list[str]]:
    """Type, fill and vocabulary of every column from the training rows; returns the encoder and
    what was inferred, imputed or left out by default (a line each, said once in the run log)."""
    medians = _medians(raw.x)
    columns, inferred, imputed, sparse = [], {}, {}, []
    declared, undeclared = {name: cfg.column_spec(name) for name in cfg.columns}, ColumnSpec()  # once, not per column
    unreadable = []
    for j, name in enumerate(names):
        spec = declared.get(name, undeclared)
        try:
            column, missing = _fit_column(raw, j, name, cfg, spec, medians[j], source)
        except UnreadableCells as exc:  # every column's, said at once
            unreadable.append(exc)
            continue
        if spec.type is None and column.kind != "number":
            inferred[name] = _described(column, raw.cells(j))
            if column.kind == "category":
                sparse.append(_category_warning(name, present_categories(column), len(raw.x) - missing))
        elif spec.type is None and j not in raw.text and cfg.shape is None:
            sparse.append(_row_number(name, raw.x[:, j]))
        if column.kind == "category":
            sparse.append(category_twins(name, present_categories(column)))
        if missing:
            how = _filled_with(column_strategy(spec.missing, cfg.missing_values, column.kind), column)
            imputed.setdefault(how, []).append((name, missing, column.indicator))
        columns.append(column)
    if unreadable:
        raise UnreadableCells.combined(unreadable)
    constant: list[str] = []
    if cfg.shape is None:  # image rows keep every pixel: the shape needs them
        columns, constant = _without_constants(columns, raw, source)
    return ColumnEncoder(columns, cfg.unseen_categories), _notes([v for k, v in inferred.items() if k not in constant],
                                                                  constant, imputed) + [n for n in sparse if n]


def column_strategy(own: str | None, table_wide: str, kind: str) -> str:
    """How a column's missing cells are filled: its own data.columns setting, else data.missing_values
    (a table-wide mean or median is for the kinds it averages, numbers and dates: the others take their
    most frequent value)."""
    if own is None and table_wide in ("mean", "median") and not kind_named(kind).averaged:
        return "most_frequent"
    return own or table_wide


def fill_name(strategy: str, column: Column) -> str:
    """What data.missing_values `strategy` fills `column` with, in words."""
    if strategy == "auto" and own_missing_category(column):
        return "a category of its own"
    if strategy in ("auto", "error"):
        strategy = "median" if column.form.declaration.averaged else "most_frequent"
    return {"median": column.form.median_name, "mean": "mean",
            "most_frequent": "most frequent value", "constant": "constant"}[strategy]


def _filled_with(strategy: str, column: Column) -> str:
    """'the training rows' median', 'the constant 'n/a'' or 'a category of their own, '(missing)''
    (the run log's words for a fill)."""
    how = fill_name(strategy, column)
    if how == "a category of its own":
        return f"a category of their own, {column.fill!r}"
    return f"the constant {column.fill!r}" if how == "constant" else f"the training rows' {how}"


def _described(column: Column, cells: np.ndarray) -> str:
    """'name (kind, what it holds)': an inferred type, for the run log (a boolean's words as its
    training `cells` write them)."""
    return f"{column.name} ({column.kind}{column.form.held(column, cells)})"


def typed(name: str, kind: str) -> str:
    """`data.columns.NAME: KIND`, or `data.columns: {'NAME': KIND}` for a name a dotted key cannot
    spell (empty, or holding dots, colons, quotes or brackets)."""
    plain = name and name == name.strip() and not re.search(r"[.:'\"{}\[\],#]", name)
    return f"data.columns.{name}: {kind}" if plain else f"data.columns: {{{name!r}: {kind}}}"


def _notes(inferred: list[str], constant: list[str], imputed: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    notes = [f"columns read as categories (one-hot), booleans or dates: {', '.join(inferred)}; set "
             "data.columns.<name> to type them yourself"] if inferred else []
    notes += [f"constant columns left out of the inputs (one value in every training row): {', '.join(constant[:20])}"
              + (f" (+{len(constant) - 20} more)" if len(constant) > 20 else "")] if constant else []
    return notes + [f"missing cells filled with {how}: "
                    f"{', '.join(f'{name} ({count})' for name, count, _ in cols)} (data.missing_values; "
                    + _indicators([name for name, _, marked in cols if marked]) + ")" for how, cols in imputed.items()]


def _indicators(names: list[str]) -> str:
    return f"0/1 columns added: {', '.join(f'{n}_missing' for n in names)}" if names else \
        "data.missing_indicator adds 0/1 columns"



def _without_constants(columns: list[Column], raw: RawColumns, source: str) -> tuple[list[Column], list[str]]:
    """The columns with those that hold one value in every training row (nothing to learn from; a
    missing indicator aside) made `constant`, and their names; all of them constant is refused."""
    spread = _spreads(raw.x)
    constant = []
    for j, column in enumerate(columns):
        cells = raw.cells(j) if j in raw.text else None
        values = 1 + spread[j] if cells is None else len(np.unique(canonical(cells[~is_missing(cells)])))
        values += int(own_missing_category(column))  # blank or a value: two values to learn from
        if values <= 1 and not column.indicator and column.kind != "constant":
            constant.append(column.name)
            columns[j] = Column(column.name, "constant")
    if columns and len(constant) == len(columns):
        raise DataError(f"{source}: every feature column holds one value in all the training rows "
                        f"({', '.join(constant[:10])}): nothing to learn from")
    return columns, constant


def _spreads(x: np.ndarray) -> np.ndarray:
    """Per column: 1 where its present cells hold more than one value, else 0 (one pass)."""
    if not len(x):
        return np.zeros(x.shape[1], int)
    return (np.fmax.reduce(x, axis=0) > np.fmin.reduce(x, axis=0)).astype(int)  # NaN skipped; all-missing: 0


def _fit_column(raw: RawColumns, j: int, name: str, cfg: DataConfig, spec: ColumnSpec, median: float,
                source: str) -> tuple[Column, int]:
    """One column fitted (`spec`: its data.columns entry), and how many of its training cells were missing."""
    kind, date_format = _kind(raw, j, name, spec, cfg.date_format or "", source)
    missing = np.isnan(raw.x[:, j]) if j not in raw.text else is_missing(raw.text[j])
    strategy = column_strategy(spec.missing, cfg.missing_values, kind)
    if missing.any() and strategy == "error":
        raise DataError(f"{source}: column {name!r}, data row {raw.row(raw.first(missing))}: a missing cell, and "
                        "data.missing_values is error; fill the data, or choose median, mean, most_frequent or constant")
    if strategy == "constant" and spec.fill_value is None and missing.any():
        raise DataError(f"{source}: column {name!r} has missing cells and data.missing_values is constant, but no "
                        f"fill value: give data.columns.{name}: {{missing: constant, fill_value: ...}}, or choose "
                        "median, mean or most_frequent")
    indicator = spec.indicator if spec.indicator is not None else cfg.missing_indicator and missing.any()
    column = Column(name, kind, indicator=bool(indicator), date_format=date_format if kind == "date" else "",
                    embedding=spec.embedding or 0 if kind == "category" else 0)
    column.form.fit(column, Training(raw, j, missing, source, median), strategy, spec.fill_value)
    return column, int(missing.sum())


def _medians(x: np.ndarray) -> list[float]:
    """Every column's median over its present cells (0 where none is present), in one pass."""
    if not len(x):
        return [0.0] * x.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-missing column
        values = np.nanmedian(x, axis=0) if np.isnan(x).any() else np.median(x, axis=0)
    return [float(v) if np.isfinite(v) else 0.0 for v in values]


def _kind(raw: RawColumns, j: int, name: str, spec: ColumnSpec, date_format: str, source: str) -> tuple[str, str]:
    """The column's type (declared, else inferred) and, for dates, the strptime format of its cells
    (data.date_format; '' for ISO 8601; else the one common format every cell is written in)."""
    if spec.type is None:
        return _inferred(raw, j, name, source, date_format)
    if spec.type == "date" and not date_format and j in raw.text:
        cells = raw.text[j]
        return "date", dates.only_format(np.unique(cells[~is_missing(cells)])) or ""
    return spec.type, date_format


def _inferred(raw: RawColumns, j: int, name: str, source: str, date_format: str = "") -> tuple[str, str]:
    """number unless a cell is text; date when every text value is a date (ISO 8601, in
    data.date_format, or else in the one common format that reads them all, which is returned);
    boolean when every one is true/false, yes/no, ...; a column of numbers with a few stray text
    cells (typos) is refused, not read as categories."""
    if j not in raw.text:
        return "number", ""
    cells = raw.text[j]
    present = ~is_missing(cells)
    values = np.unique(cells[present])
    for form in INFERRED:  # dates, then booleans
        found = form.infers(values, date_format)
        if found is not None:
            return form.declaration.name, found
    return _category_unless_numbers(raw, j, name, source, present, values), ""


def _category_unless_numbers(raw: RawColumns, j: int, name: str, source: str, present: np.ndarray,
                             values: np.ndarray, share: float = 0.9) -> str:
    """category; number when every present training cell is one (the text is in other rows, which
    then name their cell); refused when at least `share` of them are (the text cells are typos)."""
    cells = raw.text[j]
    numeric = np.isin(cells, [v for v in values if is_number(str(v))]) & present
    count, total = int(numeric.sum()), int(present.sum())
    if not total or count < share * total:
        return _category_unless_identifier(name, source, total, values)
    if count == total:
        return "number"
    stray = present & ~numeric
    raise UnreadableCells(source, name, raw.row(raw.first(stray)), f"{total - count} of the column's {total} present "
                          f"cells in the training rows are not numbers, while {count} are: "
                          f"{stray_cells(raw, cells, stray)}; fix those cells (or leave them blank: missing cells; "
                          f"words that mark a missing cell, such as 'unknown' or '-', go in data.missing_tokens), "
                          f"or read the column's values as categories ({typed(name, 'category')})")


def _category_unless_identifier(name: str, source: str, present: int, values: np.ndarray, rows: int = 20) -> str:
    """category, unless each of at least `rows` present training cells is a different value: an ID,
    whose one-hot columns (one per row) no new row would match."""
    if present < rows or len(values) < present:
        return "category"
    shown = ", ".join(repr(str(v)) for v in values[:3])  # quoted: a value may hold a comma
    hint = looks_like(values)
    raise DataError(f"{source}: column {name!r} looks like an identifier: each of its {present} present training "
                    f"cells is a different value ({shown}, ...), so as categories it would add {present} inputs that "
                    f"no new row matches{'; ' + hint if hint else ''}; leave it out ({typed(name, 'ignore')}), or "
                    f"keep it as categories if its values do repeat in new data ({typed(name, 'category')})")


def _category_warning(name: str, categories: list[str], present: int, rows: int = 20, share: float = 0.5) -> str:
    """A warning for an inferred category column whose values are mostly distinct (more than `share`
    of at least `rows` present training cells: free text, dates or numbers in a spelling not read as
    such, one-hot inputs that new rows would rarely match), or are all dates or signed numbers; '' otherwise."""
    hint = looks_like(np.array(categories, dtype=str))
    shown = f"{', '.join(map(repr, categories[:3]))}, ..."
    if present >= rows and len(categories) > share * present:
        return (f"column {name!r} has {len(categories)} different values in its {present} present training cells "
                f"({shown}): as categories they add {len(categories)} inputs that new rows rarely match"
                f"{'; ' + hint if hint else ''}; {typed(name, 'ignore')} leaves it out")
    return f"column {name!r} is read as {len(categories)} categories ({shown}), but {hint}" if hint else ""


def _row_number(name: str, values: np.ndarray, rows: int = 20) -> str:
    """A warning for a number column that holds a different whole number in each of at least `rows`
    training rows, packed into a range at most twice their count (1000, 1001, ...: an ID or a
    spreadsheet's row number, which the network would learn from); '' otherwise."""
    n = len(values)
    if n < rows or np.isnan(values).any():
        return ""
    low, high = float(values.min()), float(values.max())
    if not n - 1 <= high - low < 2 * n or not (values == np.round(values)).all() or len(np.unique(values)) < n:
        return ""
    years = 1700 <= low and high <= 2100
    if years and "year" in name.lower():  # a yearly series: the year is a real input
        return ""
    return (f"column {name!r} holds a different whole number in every training row ({low:.0f} to {high:.0f}): an "
            f"ID or a row number{' (or a year per row: then keep it)' if years else ''}? As a number it is an input "
            f"the network learns from; {typed(name, 'ignore')} leaves it out")


SIGNS = "$€£¥%"  # a currency sign before a number, or a percent sign after it


def looks_like(values: np.ndarray) -> str:
    """What mostly-distinct text values are, where they are dates in a common format or numbers
    written with currency or percent signs (neither read as such without help); '' otherwise."""
    values = values[::max(1, -(-len(values) // 200))]  # 200 spread over the sorted values (sorted ones start alike)
    formats = dates.formats_of(values)
    if len(formats) == 1:
        return f"they read as dates in data.date_format: {formats[0]!r}"
    if formats:
        return f"they read as dates: set data.date_format ({' or '.join(map(repr, formats[:3]))})"
    texts = [str(v).strip() for v in values]
    grouped = _thousands_hint(texts)
    if grouped:
        return grouped
    signed = [t for t in texts if t[:1] in SIGNS or t[-1:] in SIGNS]
    if len(signed) * 2 >= len(texts) and all(is_number(t.strip(SIGNS + " ").replace(",", "")) for t in signed):
        signs = sorted({c for t in signed for c in (t[0], t[-1]) if c in SIGNS})
        example = "16, not 16%" if signs == ["%"] else "1234.5, not $1,234.50"
        return (f"they look like numbers with {' and '.join(repr(c) for c in signs)} signs, which are not read as "
                f"numbers: write the column without them (e.g. {example})")
    return ""


GROUPED = re.compile(r"[+-]?\d{1,3}(?:([ '_\u00a0\u202f])\d{3})+(?:[.,]\d+)?")
YAML_SPELLING = {" ": "' '", "'": "\"'\"", "_": "_", "\u00a0": '"\\u00a0" (a no-break space)',
                 "\u202f": '"\\u202f" (a narrow no-break space)'}


def _thousands_hint(texts: list[str]) -> str:
    """Numbers with their thousands grouped by a space, an apostrophe or an underscore ('165 357'),
    which are read as numbers only when data.thousands says so; '' otherwise."""
    found = {t: m.group(1) for t in texts if (m := GROUPED.fullmatch(t))}
    if len(found) * 2 < len(texts) or len(set(found.values())) != 1:
        return ""
    example, separator = next(iter(found.items()))
    decimal = " (and data.decimal: ',' if a comma marks the decimals)" if any("," in t for t in found) else ""
    return (f"they look like numbers with {separator!r} between thousands, e.g. {example!r}: set data.thousands: "
            f"{YAML_SPELLING[separator]}{decimal} to read them as numbers")
