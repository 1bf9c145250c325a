"""The column kinds' declarations: what a feature column can be, and the facts about each that the
config, fitting, encoding and export read. The runtime half of each encoded kind (its inference rule,
fill, encoding and ONNX form) is `data/column_kinds.py`; `image` columns are read by
`data/image_column.py`, `ignore` ones are left out before fitting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ColumnKindDecl:
    name: str
    summary: str
    declared: bool = True     # a user may write it in data.columns (a constant column is found, not declared)
    encoded: bool = True      # fitted and encoded by the column encoder (its runtime class in data/column_kinds.py)
    averaged: bool = False    # a table-wide mean or median fills it (the others take their most frequent value)
    scaled: bool = False      # its encoded values are numbers that input normalization scales
    cell: Literal["number", "text", "seconds", ""] = "text"  # what its exported graph's input holds ('': none)

    def tag(self) -> str:
        """The name its runtime class registers under (`core/registry.py`)."""
        return self.name


DECLARATIONS: dict[str, ColumnKindDecl] = {d.name: d for d in (
    ColumnKindDecl("number", "numbers", averaged=True, scaled=True, cell="number"),
    ColumnKindDecl("category", "categories (one-hot, or an embedding)"),
    ColumnKindDecl("boolean", "true/false, yes/no, t/f, y/n, 1/0 (one 0/1 input)"),
    ColumnKindDecl("date", "dates (year, month, day, weekday, day of year, hour)", averaged=True, scaled=True,
                   cell="seconds"),
    ColumnKindDecl("ignore", "left out of the inputs", encoded=False),
    ColumnKindDecl("image", "paths of image files, relative to the table, decoded by data.image: the samples",
                   encoded=False),
    ColumnKindDecl("constant", "one value in every training row: left out", declared=False, cell=""),
)}

DECLARED: tuple[str, ...] = tuple(name for name, d in DECLARATIONS.items() if d.declared)


def kind_named(name: str) -> ColumnKindDecl:
    return DECLARATIONS[name]


def kinds_said() -> str:
    """'number (numbers) | category (...) | ...': the declarable kinds, for the schema's text."""
    return " | ".join(f"{name} ({DECLARATIONS[name].summary})" for name in DECLARED)
