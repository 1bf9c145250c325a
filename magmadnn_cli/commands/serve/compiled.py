"""A request's rows (JSON, or CSV text) encoded straight into the network's inputs by the model's own
encoding compiled once: number columns read a column at a time, and each category or boolean column
through a table of the values requests have sent, each encoded once by its column's own `encode` (so a
cell costs a dict lookup, not its text's parsing, case folding and spelling). Exactly the rows the
general path (`records.json_table` or `csv_table`, then `encoding.encode`) gives: whatever it does not
take the same way (a column missing, extra or typed otherwise, a missing cell the model refuses, an
unseen category it refuses, an infinite cell, a date, a quoted CSV cell) answers None, and that path
reads the request, with its messages."""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any, Iterable

import numpy as np

from ...data.cells import RawColumns
from ...data.column_kinds import Encoding
from ...data.fitting import column_strategy
from ...data.numbers import typed_cells
from ...data.records import NUMERIC, csv_body, json_cell
from ...data.table import ReadSpec, Table
from ...errors import DataError
from ...inference import Predictor
from . import scan

CACHED = 4096  # distinct values a column's table holds; a request past it goes the general way
NAN = float("nan")  # the one NaN the tables key (NaN != NaN: each parsed NaN would be a new key)
LOOKED_UP = ("category", "boolean")  # the kinds whose encoding is a lookup per cell
FLAT = NUMERIC | {str, bool}  # the JSON values a cell may hold


class Compiled:
    """The model's encoding of a request's rows: JSON values (lists or records), or CSV text (for a
    model with category or boolean columns: the line reader is quick on numbers). Its tables of values
    grow in the model's thread only."""

    def __init__(self, model: Predictor, spec: ReadSpec) -> None:
        saved, cfg = model.saved, model.saved.config.data
        self.saved, self.source = saved, "request"
        self.features = list(saved.features)
        self.order = tuple(self.features)
        columns = saved.encoder.columns
        text = spec.text_columns(self.features)
        self.usable = ([c.name for c in columns] == self.features and not cfg.missing_tokens and saved.encoder.width > 0
                       and all((c.kind in LOOKED_UP) == (j in text) and c.kind in LOOKED_UP + ("number", "constant")
                               for j, c in enumerate(columns)))
        self.text = sorted(text)
        self.refuses = [column_strategy(cfg.column_spec(c.name).missing, cfg.missing_values, c.kind) == "error"
                        for c in columns]
        self.how = Encoding(np.dtype(spec.dtype or np.float32), self.source,
                            "unseen: error" if saved.encoder.unseen == "error" else None, True)
        self.tables: dict[int, tuple[dict[tuple[type, Any], int], list[np.ndarray], list[bool]]] = {
            j: ({}, [], []) for j in self.text}
        self.layout = scan.Layout(self.features) if self.usable and not self.text else None

    def from_bytes(self, body: bytes) -> tuple[Table, np.ndarray] | None:
        """`from_json`'s for a JSON body of plain numbers read straight from its bytes (`scan`), or None."""
        wide = scan.numbers(body, self.layout) if self.layout is not None else None
        if wide is None:
            return None
        with np.errstate(over="ignore"):
            return self._normalized(self._transformed(wide.astype(self.how.dtype)))

    def from_json(self, payload: Any) -> tuple[Table, np.ndarray] | None:
        """(a table of the rows' count, for messages, and their network inputs), or None."""
        cells = self._rows(payload) if self.usable else None
        return self._normalized(self._encode(cells)) if cells else None

    def from_csv(self, text: str, spec: ReadSpec) -> tuple[Table, np.ndarray] | None:
        """`from_json`'s for CSV text read as `csv_table` reads it, or None."""
        if not (self.usable and self.text) or '"' in text or "\r" in text:
            return None
        try:
            body = csv_body(text, spec, self.source)
        except DataError:  # the general path says what is wrong
            return None
        fields = [line.rstrip("\n").split(body.fmt.delimiter) for line in body.rows]
        if body.wanted != self.features or not fields or not body.fmt.plain_numbers or \
                any(len(f) != len(body.names) for f in fields):
            return None
        cells = np.array(list(chain.from_iterable(fields)), dtype=object).reshape(len(fields), len(body.names))
        return self._normalized(self._csv_encode(cells[:, [body.names.index(n) for n in self.features]]))

    def _csv_encode(self, cells: np.ndarray) -> np.ndarray | None:
        """CSV cells' (Python strings) encoded rows: number columns typed as the line reader types
        them, the others looked up (each distinct cell read once as a text cell)."""
        x = np.full(cells.shape, np.nan, self.how.dtype)
        for j in range(cells.shape[1]):
            if j in self.tables:
                continue
            try:  # every cell a number (a missing one is not): float() of each, as typed_cells reads them
                with np.errstate(over="ignore"):
                    x[:, j] = cells[:, j].astype(np.float64)
            except ValueError:
                numbers, text = typed_cells(cells[:, j:j + 1].astype(str), self.how.dtype)
                if text:
                    return None
                x[:, j] = numbers[:, 0]
        if not self._numbers_taken(x, [j for j in range(x.shape[1]) if j not in self.tables]):
            return None
        return self._blocks(x, {j: tuple(cells[:, j].tolist()) for j in self.tables})

    def _numbers_taken(self, x: np.ndarray, numeric: list[int]) -> bool:
        """No infinite cell, and no missing one where the model refuses them."""
        return not (np.isinf(x).any() or any(self.refuses[j] and np.isnan(x[:, j]).any() for j in numeric))

    def _normalized(self, x: np.ndarray | None) -> tuple[Table, np.ndarray] | None:
        if x is None:
            return None
        with np.errstate(all="ignore"):
            normalized = self.saved.normalizer(x.reshape((len(x),) + self.saved.sample_shape))
        if not np.isfinite(normalized).all():
            return None
        return Table(RawColumns(np.empty((len(x), 0), x.dtype)), None, self.features, self.source), normalized

    def _rows(self, payload: Any) -> list[Iterable[Any]] | None:
        """The rows' values in feature order, where the body names exactly the model's columns (records
        whose keys all come in the model's order: their values as they are, no lookup per key)."""
        if isinstance(payload, dict) and len(payload) == 1:
            (key, body), = payload.items()
            if key == "dataframe_split" and isinstance(body, dict) and body.keys() == {"columns", "data"}:
                return self._split(body["columns"], body["data"])
            payload = body if key in ("dataframe_records", "instances", "inputs") else None
        elif isinstance(payload, dict) and payload.keys() == {"columns", "data"}:
            return self._split(payload["columns"], payload["data"])
        if not isinstance(payload, list) or not payload or not isinstance(payload[0], dict):
            return None
        if set(map(type, payload)) != {dict} or set(map(len, payload)) != {len(self.features)}:
            return None
        if set(map(tuple, payload)) == {self.order}:  # keys as the model orders them: the values as they are
            return list(map(dict.values, payload))
        get = itemgetter(*self.features)
        try:  # each record holds the model's columns (and, as long, only them)
            return [get(r) for r in payload] if len(self.features) > 1 else [(get(r),) for r in payload]
        except KeyError:
            return None

    def _split(self, names: Any, rows: Any) -> list[Any] | None:
        """dataframe_split's rows in feature order, where its columns are the model's (in any order)."""
        k = len(self.features)
        if not isinstance(names, list) or set(map(type, names)) != {str} or len(names) != k or \
                set(names) != set(self.features) or \
                not isinstance(rows, list) or set(map(type, rows)) != {list} or set(map(len, rows)) != {k}:
            return None
        if names == self.features:
            return rows
        get = itemgetter(*(names.index(n) for n in self.features))
        return [get(r) for r in rows] if k > 1 else [(get(r),) for r in rows]

    def _encode(self, cells: list[Iterable[Any]]) -> np.ndarray | None:
        """The encoded rows before normalization, or None."""
        dtype, n = self.how.dtype, len(cells)
        columns = list(zip(*cells)) if self.text else None
        numeric = [j for j in range(len(self.features)) if j not in self.tables]
        values = list(chain.from_iterable([columns[j] for j in numeric] if columns is not None else cells))
        if not set(map(type, values)) <= NUMERIC:
            return None
        try:
            wide = np.fromiter(values, np.float64, len(values))
        except OverflowError:  # an integer past float64: the general path reads it as text
            return None
        wide = wide.reshape((len(numeric), n) if columns is not None else (n, -1))
        with np.errstate(over="ignore"):
            x = np.full((n, len(self.features)), np.nan, dtype)
            x[:, numeric] = wide.T if columns is not None else wide
        if columns is not None:
            return self._blocks(x, columns) if self._numbers_taken(x, numeric) else None
        return self._transformed(x)

    def _transformed(self, x: np.ndarray) -> np.ndarray | None:
        """A model of number columns only: its cells (C order) encoded, or None (an infinite or refused cell)."""
        if not self._numbers_taken(x, list(range(x.shape[1]))):
            return None
        return self.saved.encoder.transform(RawColumns(x), self.source)[0]

    def _blocks(self, x: np.ndarray, columns: Any) -> np.ndarray | None:
        """Each column's block: numbers by their column's encoding, the others looked up."""
        blocks = []
        for j, column in enumerate(self.saved.encoder.columns):
            if j not in self.tables:
                blocks.append(column.form.encode(column, RawColumns(x), j, self.how)[0])
                continue
            block = self._looked_up(j, columns[j])
            if block is None:
                return None
            blocks.append(block)
        return np.concatenate(blocks, axis=1)

    def _looked_up(self, j: int, values: tuple[Any, ...]) -> np.ndarray | None:
        """Column j's block through its table of values seen (each new one encoded once), or None."""
        index, rows, missing = self.tables[j]
        if not set(map(type, values)) <= FLAT:
            return None
        keys = [(kind, NAN) if kind is float and value != value else (kind, value)  # one key for every NaN
                for kind, value in zip(map(type, values), values)]
        for key in set(keys) - index.keys():
            if len(index) >= CACHED:
                return None
            row = self._one(j, key[1])
            if row is None:
                return None
            index[key] = len(rows)
            rows.append(row[0][0])
            missing.append(row[1])
        codes = np.fromiter(map(index.__getitem__, keys), np.intp, len(keys))
        if self.refuses[j] and np.asarray(missing)[codes].any():
            return None
        return np.stack(rows)[codes]

    def _one(self, j: int, value: Any) -> tuple[np.ndarray, bool] | None:
        """A value's encoded block row and whether it is a missing cell, as the general path reads it
        (its text as a CSV cell holds it, typed as a text column, then the column's `encode`), or None
        where that path would refuse it."""
        column = self.saved.encoder.columns[j]
        try:
            text = json_cell(value, column.name, self.source, 0)
            _, found = typed_cells(np.array([[text]], dtype=str), self.how.dtype, {0})
            block, _ = column.form.encode(column, RawColumns(np.full((1, 1), np.nan, self.how.dtype), found), 0,
                                          self.how)
        except Exception:  # noqa: BLE001  (refused: the general path names it)
            return None
        return block, found[0][0] == ""
