"""Feature columns as people's files hold them: numbers, categories (one-hot), booleans, dates and
missing cells, encoded as fitted on the training rows (`fitting.py`) and stored with the model, so
evaluate and predict encode new rows exactly as training did (scikit-learn's ColumnTransformer with
SimpleImputer + MissingIndicator + OneHotEncoder, Ludwig's per-feature preprocessing)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .cells import RawColumns, UnreadableCells, is_missing
from .cells import canonical, refuse_duplicate_names  # noqa: F401  (TEMP: helpers' files still import these here)
from .column_kinds import FORMS, ColumnForm, Encoding


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

    @property
    def form(self) -> ColumnForm:
        """Its kind's runtime: inference, fill, encoding and ONNX form (`column_kinds.py`)."""
        return FORMS[self.kind]

    def values(self) -> list[str]:
        """The names of the columns its values encode into (before a missing indicator)."""
        return self.form.values(self)

    def output_names(self) -> list[str]:
        return self.values() + ([f"{self.name}_missing"] if self.indicator else [])

    def numbers(self) -> list[bool]:
        """Which of its output columns are numbers (the ones input normalization scales)."""
        scaled = self.form.declaration.scaled
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
        return all(c.form.declaration.cell in ("number", "") and not c.indicator for c in self.columns)

    def number_mask(self) -> np.ndarray:
        """Which output columns are numbers (the ones input normalization scales)."""
        return np.array([flag for c in self.columns for flag in c.numbers()], dtype=bool)

    def output_names(self) -> list[str]:
        return [n for c in self.columns for n in c.output_names()]

    def inputs(self) -> list[Column]:
        """The columns the model reads (a constant one is left out)."""
        return [c for c in self.columns if c.form.declaration.cell]

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
            kept = [j for j, c in enumerate(self.columns) if c.form.declaration.cell == "number"]
            x = x[:, kept] if len(kept) < len(self.columns) else x
            missing = np.isnan(x)
            if missing.any():
                fills = np.array([self.columns[j].fill for j in kept], dtype=x.dtype)
                x = np.where(missing, fills, x)
            return x, {}
        parts, unseen, unreadable = [], {}, []
        how = Encoding(x.dtype, source, self._refusal(strict), self.saved)
        for j, col in enumerate(self.columns):
            try:
                block, count = col.form.encode(col, raw, j, how)
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
