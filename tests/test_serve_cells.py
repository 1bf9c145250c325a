"""Request bodies' cells (data/records.py): declared text columns and columns holding text are typed by
one function (numbers.typed_cells, as a CSV file's cells are); a comma-separated CSV body without a
quote is read in the plain number style without sampling it (none of its cells can hold a comma)."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.data import records
from magmadnn_cli.inference import Predictor, read_spec
from serve_helpers import HEART_NAMES, csv_text, heart_rows, train_models


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    model = Predictor(train_models(tmp_path_factory.mktemp("models"), only=("heart",))["heart"], "cpu")
    with model.using():
        yield read_spec(model.path, model.saved, False)


def counted(monkeypatch, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(records, name)
    monkeypatch.setattr(records, name, lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def test_text_cells_are_typed_by_one_function(spec, monkeypatch):
    rows = [dict(zip(HEART_NAMES, r)) for r in heart_rows(count=6)]  # every cell a string: declared text and not
    calls = counted(monkeypatch, "typed_cells")
    table = records.json_table(rows, spec, "request")
    assert len(calls) == 1
    only_text = [{k: (v if k in ("cp", "thal") else float(v) if v != "?" else None) for k, v in r.items()} for r in rows]
    reference = records.json_table(only_text, spec, "request")
    assert len(calls) == 2  # strings in declared text columns only: the same function
    reference_csv = records.csv_table(csv_text(HEART_NAMES, heart_rows(count=6)), spec, "request")
    for got in (table, reference):
        assert np.array_equal(got.x, reference_csv.x, equal_nan=True)
        assert {j: c.tolist() for j, c in got.raw.text.items()} == {j: c.tolist() for j, c in
                                                                   reference_csv.raw.text.items()}


def test_a_csv_body_without_quotes_is_read_plain_without_sampling(spec, monkeypatch):
    calls = counted(monkeypatch, "detect_style")
    plain = records.csv_table(csv_text(HEART_NAMES, heart_rows(count=5)), spec, "request")
    assert calls == []
    header, first, *rest = csv_text(HEART_NAMES, heart_rows(count=5)).splitlines()
    quoted = "\n".join([header, '"' + first.replace(",", '",', 1), *rest])  # its first cell quoted
    assert np.array_equal(records.csv_table(quoted, spec, "request").x, plain.x, equal_nan=True) and len(calls) == 1
    grouped = csv_text(HEART_NAMES, [[c if j != 4 else "1,234" for j, c in enumerate(r)] for r in heart_rows(count=3)])
    assert records.csv_table(grouped, spec, "request").x[:, 4].tolist() == [1234.0] * 3  # '"1,234"': thousands
    semicolons = "\n".join(";".join(c.replace(".", ",") for c in r) for r in [HEART_NAMES] + heart_rows(count=3))
    assert np.array_equal(records.csv_table(semicolons, spec, "request").x, plain.x[:3], equal_nan=True)  # 3,5
