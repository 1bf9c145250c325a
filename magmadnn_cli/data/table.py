"""A table as read from any format (feature cells, raw targets, column names) and what every table
reader shares: what to read (`ReadSpec`), the columns checked against the file's, the memory bound of
a whole read, rows without a target left out, labels typed, infinities refused."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config.data import DataConfig
from ..core import backend as B
from ..errors import DataError
from ..config.tasks import LABEL_SEPARATOR
from .cells import FALSE, TRUE, MissingTokens, RawColumns, is_missing
from .csv_reader import CsvFormat, detect, with_number_style
from .text_source import ReadBound


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
    settled: dict[str, Any] = field(default_factory=dict)  # data.* settings read off the file (decimal, ...)

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
    target_fix: str = ""                   # the fix where the target column is absent (default: data.target)
    features_from: str = ""                # who wants `features` where the config does not: "the model"
    labels: tuple[str, ...] = ()           # a multi-label target's 0/1 columns (read as kept text, then one target)

    @classmethod
    def of(cls, cfg: DataConfig, need_target: bool = True, features: list[str] | None = None,
           keep: tuple[str, ...] = (), features_from: str = "") -> "ReadSpec":
        """How to read a file of this data section (its target only if `need_target`)."""
        labels = cfg.label_columns if need_target else ()
        target = cfg.target if need_target and not labels else None
        return cls(target, features or cfg.features, need_target, cfg, B.current().floatx,
                   tuple(cfg.names) if cfg.names else None, tuple(dict.fromkeys(keep + labels)),
                   features_from=features_from, labels=labels)

    def csv_format(self, path: Path) -> CsvFormat:
        data = self.data
        optional = () if self.need_target or not data else tuple(data.target_columns)
        fmt = detect(path, data.delimiter if data else None, data.encoding if data else "utf-8", self.header, optional)
        return with_number_style(path, fmt, data.decimal if data else None, data.thousands if data else None)

    def blanked(self, table: "Table") -> "Table":
        """The table (one read or chunk) with its `data.missing_tokens` as missing cells: blank in text
        columns and the target, NaN where a number column holds a number token (so a number column
        holding '-' or -999 reads as numbers with missing cells)."""
        tokens = MissingTokens.of(self.data.missing_tokens) if self.data is not None else MissingTokens()
        if tokens.words:
            for j, cells in table.raw.text.items():
                table.raw.text[j] = tokens.blank(cells)
            tokens.nan(table.raw.x)
            table.y = tokens.blank(table.y) if table.y is not None and table.y.dtype.kind in "OUS" else table.y
        return table

    def wanted(self, names: list[str]) -> list[str]:
        if self.features:
            return list(self.features)
        ignored = {n for n in self._declared() if self.data.column_spec(n).type == "ignore"}
        return [n for n in names if n != self.target and n not in self.labels and n not in ignored]

    def text_columns(self, wanted: list[str]) -> set[int]:
        """Positions of the columns declared category or boolean: read as text from the start."""
        text = {n for n in self._declared() if self.data.column_spec(n).type in ("category", "boolean", "date")}
        return {j for j, n in enumerate(wanted) if n in text}

    def _declared(self) -> list[str]:
        """The columns data.columns types (the others have no declared type: no lookup per column)."""
        return list(self.data.columns) if self.data is not None else []


def _closest(name: str, names: list[str]) -> str:
    """'; did you mean ...?' for the column most like `name` (case first), or ''."""
    close = [n for n in names if n.lower() == name.lower()] or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


COLUMN_BYTES = 4096         # per feature column, before any row: names, parsing, fitted encoders, the model's
                            # inputs (a run of 1,000,000 columns x 2 rows peaked at 2.2 GiB; rounded up)


def checked_columns(path: Path, names: list[str], spec: ReadSpec) -> list[str]:
    """The feature columns to read from a file of columns `names` (checked against each other, and
    their count against the memory budget)."""
    _check_width(path, names, spec)
    target = spec.target
    if spec.labels:
        absent = [n for n in spec.labels if n not in names]
        if absent:
            raise DataError(f"{path}: no target column {absent[0]!r} (data.target lists the 0/1 label columns); "
                            f"columns are {', '.join(names[:20])}{_closest(absent[0], names)}")
    elif spec.need_target:
        if target is None:
            raise DataError(f"{path}: data.target must name the target column; columns are {', '.join(names)}")
        if target not in names:
            raise DataError(f"{path}: no target column {target!r}{'' if spec.target_fix else ' (data.target)'}; "
                            f"columns are {', '.join(names[:20])}{_closest(target, names)}{spec.target_fix}")
    wanted = spec.wanted(names)
    present = set(names)
    missing = [f for f in wanted if f not in present]
    if missing:
        wanted_by = f", which {spec.features_from} reads" if spec.features_from else " (data.features)"
        refused = spec.data is not None and "error" in (spec.data.missing_values, spec.data.column_spec(missing[0]).missing)
        fix = "" if not spec.features_from else "; add them to the file, with their values (the model refuses blank " \
            "cells: data.missing_values: error)" if refused else "; add them to the file (blank cells are filled as " \
            "in training, unless --strict)"
        raise DataError(f"{path}: missing feature column(s) {', '.join(missing[:10])}"
                        + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
                        + f"{wanted_by}; the file has {', '.join(names[:20])}"
                        + (_case_twins(missing, names) or _closest(missing[0], names) + fix))
    if not wanted:
        raise DataError(f"{path}: no feature columns besides the target {target or list(spec.labels)!r}")
    unknown = [c for c in (spec.data.columns if spec.data is not None else {}) if c not in present]
    if unknown and not spec.features:
        raise DataError(f"{path}: data.columns names {unknown[0]!r}, which is not a column of the file"
                        + (_closest(unknown[0], names) or f"; columns are {', '.join(names[:20])}"))
    absent = [k for k in spec.keep if k not in present]
    if absent:
        raise DataError(f"{path}: no column {absent[0]!r} to keep; columns are {', '.join(names[:20])}"
                        + (_case_twins(absent, names) or _closest(absent[0], names)))
    return wanted


def _case_twins(missing: list[str], names: list[str]) -> str:
    """Where the file has missing columns under other case ('pclass' for 'Pclass'): the pairs, and the fix."""
    folded = {name.casefold(): name for name in names}
    twins = [(folded[m.casefold()], m) for m in missing if m.casefold() in folded]
    if not twins:
        return ""
    shown = ", ".join(f"{have!r} for {want!r}" for have, want in twins[:6]) + (", ..." if len(twins) > 6 else "")
    return f"; names differ only in case ({shown}): write them as the model has them (names are case-sensitive)"


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


def labelled(table: Table, spec: ReadSpec) -> Table:
    """The table without the rows whose target cell is missing (blank, NA, ?, ..., or one of
    data.missing_tokens: as in feature columns), a note naming them; targets typed."""
    table = with_targets(table, spec)
    if table.y is not None:
        table.y = typed_labels(table.y)
    return table


def with_targets(table: Table, spec: ReadSpec, whole: bool = True) -> Table:
    """The rows that have a target (a multi-label target's 0/1 columns made one label set first), a
    note naming those left out; a whole table without any is refused, a chunk is left empty."""
    if spec.labels:
        table = label_sets(table, spec.labels)
    if table.y is None:
        return table
    missing = is_missing(table.y)
    tokens = ", or data.missing_tokens" if spec.data is not None and spec.data.missing_tokens else ""
    if missing.all() and whole:
        raise DataError(f"{table.source}: every row's target (column {spec.target or list(spec.labels)!r}) is missing "
                        f"(blank, NA, ?, ...{tokens}); is data.target the right column?")
    if missing.any():
        rows = np.flatnonzero(missing)
        shown = ", ".join(str(table.raw.row(int(r))) for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
        table.notes.append(f"{table.source}: {len(rows)} row(s) without a target (blank, NA, ?{tokens}: data rows "
                           f"{shown}) left out")
        kept = np.flatnonzero(~missing)
        table.raw, table.y = table.raw.rows(kept), table.y[kept]
        table.kept = {k: v[kept] for k, v in table.kept.items()}
    return table


def label_sets(table: Table, labels: tuple[str, ...]) -> Table:
    """A multi-label target of 0/1 columns (read as kept text) as one target cell per row: the names
    of its columns holding 1 (or true, yes), '|'-joined and ended by '|' (a set, though of one label
    or none); blank where a column's cell is missing (the row has no target). Other cells are refused."""
    flags, missing = [], np.zeros(len(table.raw.x), bool)
    for name in labels:
        values, rows = np.unique(table.kept.pop(name).astype(str), return_inverse=True)  # each distinct cell once
        cells = np.char.lower(np.char.strip(values))
        blank = is_missing(cells)
        true, false = np.isin(cells, TRUE), np.isin(cells, FALSE)
        bad = ~(true | false | blank)[rows.reshape(-1)]
        if bad.any():
            row = table.raw.first(bad)
            raise DataError(f"{table.source}: column {name!r}, data row {table.raw.row(row)}: "
                            f"{str(values[rows.reshape(-1)[row]]).strip()!r} is not 0 or 1; data.target lists the 0/1 "
                            "label columns, each 1 where its row has that label (true/false and yes/no read too): "
                            "fix the cell")
        flags.append(true[rows.reshape(-1)])
        missing |= blank[rows.reshape(-1)]
    table.y = np.where(missing, "", _set_cells(np.stack(flags, axis=1), labels)).astype(str)
    return table


def _set_cells(flags: np.ndarray, labels: tuple[str, ...]) -> np.ndarray:
    """Each row's labels (a row of `flags`) as a '|'-joined, '|'-ended cell: each distinct set of
    labels joined once (the rows' bits packed into bytes, so finding the sets sorts one key a row)."""
    if not len(flags):
        return np.array([], dtype=object)
    packed = np.ascontiguousarray(np.packbits(flags, axis=1))
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1)
    distinct, inverse = np.unique(keys, return_inverse=True)
    sets = np.unpackbits(distinct.view(np.uint8).reshape(len(distinct), -1), axis=1, count=len(labels)).astype(bool)
    return np.array([LABEL_SEPARATOR.join(n for n, on in zip(labels, s) if on) + LABEL_SEPARATOR for s in sets],
                    dtype=object)[inverse.reshape(-1)]


def typed_labels(raw: np.ndarray) -> np.ndarray:
    """Targets as ints if they all are, else floats if they all are, else stripped strings."""
    raw = np.char.strip(raw.astype(str))
    for kind in (np.int64, np.float64):
        try:
            return raw.astype(kind)
        except (ValueError, OverflowError):
            continue
    return raw


def check_finite(x: np.ndarray, source: Path | str, names: list[str]) -> None:
    """Missing cells are NaN (imputed later); infinities are refused."""
    bad = np.isinf(x)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise DataError(f"{source}: column {names[col]!r}, data row {row + 1}: non-finite value {x[row, col]} "
                        "(infinity); clean the data first")


def joined(parts: list[Table], spec: ReadSpec, source: Path) -> Table:
    """Chunks read whole as one table: text columns where any chunk held text (numbers of other
    chunks as text), infinities refused, rows without a target left out, labels typed."""
    if not parts:
        raise DataError(f"{source}: the file has a header but no data rows")
    text_cols = sorted({j for p in parts for j in p.raw.text})
    raw = RawColumns(np.concatenate([p.raw.x for p in parts]) if len(parts) > 1 else parts[0].raw.x,
                     {j: np.concatenate([p.raw.cells(j) for p in parts]) for j in text_cols})
    for j in text_cols:
        raw.x[:, j] = np.nan
    y = np.concatenate([p.y for p in parts]) if parts[0].y is not None and spec.need_target else None
    check_finite(raw.x, source, parts[0].features)
    kept = {k: np.concatenate([p.kept[k] for p in parts]) for k in parts[0].kept}
    table = Table(raw, y, parts[0].features, str(source), kept, notes=list(parts[0].notes))
    return labelled(table, spec)
