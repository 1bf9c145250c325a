"""Text held as wide as its longest cell: long cells (free text) are refused where they would make
the text take 1/8 of the memory budget, short ones (labels, ids) only where their text cannot be held
at all; either way by column and row, with the fix that fits (integration of issue 44 items 3 and the
encoded-features check, which a column of short ids in a small budget used to be refused before)."""

from __future__ import annotations

import pytest

from magmadnn_cli.core import backend as B
from magmadnn_cli.data import csv_reader
from magmadnn_cli.errors import DataError

pa = pytest.importorskip("pyarrow")
from magmadnn_cli.data import columnar

ROWS = 60


def _distinct(cells: list[str], tmp_path):
    return columnar._distinct(pa.array(cells), "notes", tmp_path / "d.parquet")


def test_a_long_cell_is_refused_at_an_eighth_of_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(B, "host_memory_available", lambda: 1 << 20)  # 4 B x 2,000 x 121 cells: 0.9 MiB
    cells = ["short"] * ROWS
    cells[7] = "z" * 2_000
    with pytest.raises(DataError) as caught:
        _distinct(cells, tmp_path)
    said = str(caught.value)
    assert said.startswith(f"{tmp_path / 'd.parquet'}: column 'notes', data row 8: a cell of 2,000 characters"), said
    assert "more than 1/8 of the 1.0 MiB available" in said and said.endswith(
        "leave the column out (data.columns.notes: ignore), or shorten its cells"), said


def test_short_cells_of_the_same_size_are_held(tmp_path, monkeypatch):
    """Ids or labels of 1,000 characters: as wide as the data itself, held while they fit the budget
    (the encoded features are checked, and named, where they are built)."""
    monkeypatch.setattr(B, "host_memory_available", lambda: 1 << 20)
    values, rows = _distinct([f"{i:04d}" + "x" * 996 for i in range(ROWS)], tmp_path)
    assert len(values) == ROWS + 1 and list(rows) == list(range(ROWS))


def test_short_cells_beyond_the_whole_budget_are_refused_with_fewer_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(B, "host_memory_available", lambda: 2_000)  # 4 B x 5 x 121 cells: 2,420 B
    with pytest.raises(DataError) as caught:
        _distinct([f"C{1000 + i}" for i in range(ROWS)], tmp_path)
    said = str(caught.value)
    assert "column 'notes', data row 1: a cell of 5 characters" in said and "more than the " in said \
        and "1/8" not in said and said.endswith("(data.columns.notes: ignore), or read fewer rows"), said


def test_csv_lines_follow_the_same_rule(tmp_path, monkeypatch):
    """The line reader holds a chunk's chosen cells as wide as its longest: short ones pass where a
    long one of the same size is refused by line."""
    monkeypatch.setattr(B, "host_memory_available", lambda: 1 << 20)
    short = [f"{i},{'s' * 1_000},x\n" for i in range(ROWS)]
    assert csv_reader.parse_rows(short, tmp_path / "w.csv", ["n", "notes", "label"], [1], 2,
                                 csv_reader.CsvFormat(), str).shape == (ROWS, 1)
    long = short[:9] + [f"9,{'l' * 2_000},x\n"] + short[10:]
    with pytest.raises(DataError) as caught:
        csv_reader.parse_rows(long, tmp_path / "w.csv", ["n", "notes", "label"], [1], 2, csv_reader.CsvFormat(), str)
    assert str(caught.value).startswith(f"{tmp_path / 'w.csv'}:11: column 'notes' holds a cell of 2,000 characters")
    assert "more than 1/8 of the 1.0 MiB available" in str(caught.value)
