"""Tables from rows in memory (data/records.py): JSON records, MLflow's dataframe_split and
dataframe_records, and CSV text give the rows `predict` gives for a file of them, to the digit."""

from __future__ import annotations


import numpy as np

import pytest

from magmadnn_cli.data.records import csv_table, json_table
from magmadnn_cli.errors import DataError
from magmadnn_cli.inference import Predictor, new_tally, read_spec
from serve_helpers import HEART_NAMES, csv_text, digits_rows, heart_rows, predicted, records, train_models


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return train_models(tmp_path_factory.mktemp("models"))


def answer(model: Predictor, table_of, body, proba: bool = True) -> list[list[str]]:
    with model.using():
        spec = read_spec(model.path, model.saved, False)
        return model.predict_table(table_of(body, spec, "request"), proba, (), False, new_tally()).tolist()


@pytest.mark.parametrize("name", ["heart", "digits"])
def test_every_body_form_answers_as_predict_does(models, name, capsys, tmp_path):
    names, rows = (HEART_NAMES, heart_rows()) if name == "heart" else digits_rows()
    expected = predicted(capsys, models[name], tmp_path, names, rows)
    model = Predictor(models[name], "cpu")
    split = {"columns": names, "data": [[r[n] for n in names] for r in records(names, rows)]}
    assert answer(model, json_table, records(names, rows)) == expected
    assert answer(model, json_table, {"dataframe_records": records(names, rows)}) == expected
    assert answer(model, json_table, {"dataframe_split": split}) == expected
    assert answer(model, json_table, split) == expected
    assert answer(model, csv_table, csv_text(names, rows)) == expected
    assert answer(model, json_table, records(names, rows), proba=False) == [r[:1] for r in expected]


def test_text_cells_missing_keys_and_headerless_csv_read_as_a_file_would(models, capsys, tmp_path):
    rows = heart_rows(count=30, start=160)  # rows 167 and 193 of the file hold '?'
    assert any("?" in r for r in rows)
    expected = predicted(capsys, models["heart"], tmp_path, HEART_NAMES, rows)
    model = Predictor(models["heart"], "cpu")
    as_text = [dict(zip(HEART_NAMES, r)) for r in rows]  # every value a string, '?' included
    assert answer(model, json_table, as_text) == expected
    lacking = [{k: v for k, v in r.items() if v is not None} for r in records(HEART_NAMES, rows)]
    assert answer(model, json_table, lacking) == expected  # a key left out is a missing cell
    assert answer(model, csv_table, csv_text(HEART_NAMES, rows, header=False)) == expected  # data.names


def test_bad_bodies_get_predicts_messages(models, capsys, tmp_path):
    names, cells = digits_rows(count=3)
    data = tmp_path / "rows.csv"
    data.write_text(csv_text(names[1:], [r[1:] for r in cells]))
    from conftest import run_cli
    code, _, err = run_cli(capsys, "predict", models["digits"], data)
    assert code == 2
    file_message = " ".join(err.split()).split(f"{data}: ", 1)[1]
    with pytest.raises(DataError) as missing:
        answer(Predictor(models["digits"], "cpu"), json_table, [dict(list(r.items())[1:]) for r in records(names, cells)])
    assert " ".join(str(missing.value).split()) == f"request: {file_message}"
    model = Predictor(models["heart"], "cpu")
    rows = records(HEART_NAMES, heart_rows(count=3))
    with pytest.raises(DataError, match=r"request: missing feature column\(s\) age, .*did you mean 'agee'\?"):
        answer(model, json_table, [{("agee" if k == "age" else k): v for k, v in r.items()} for r in rows])
    with pytest.raises(DataError, match=r"request: unknown column\(s\) 'id'; the model reads age, sex, .*leave"):
        answer(model, json_table, [{**r, "id": 7} for r in rows])
    assert len(answer(model, json_table, [{**r, "num": 1} for r in rows])) == 3  # the target: not read
    with pytest.raises(DataError, match=r"column 'chol', data row 2: .*inf"):
        answer(model, json_table, [r if i != 1 else {**r, "chol": "inf"} for i, r in enumerate(rows)])
    with pytest.raises(DataError, match=r"column 'chol', data row 3: a JSON array"):
        answer(model, json_table, [r if i != 2 else {**r, "chol": [1]} for i, r in enumerate(rows)])
    with pytest.raises(DataError, match=r"data row 2 has 3 values; \"columns\" names 13"):
        answer(model, json_table, {"dataframe_split": {"columns": HEART_NAMES, "data": [list(rows[0].values()),
                                                                                        [1, 2, 3]]}})
    with pytest.raises(DataError, match="expected a JSON list of records"):
        answer(model, json_table, {"rows": []})


@pytest.mark.parametrize("name", ["heart", "digits"])
def test_no_rows_get_no_predictions_with_the_columns_as_ever(models, name):
    """An empty request is answered by the same path as any other (it failed in the encoding before)."""
    model = Predictor(models[name], "cpu")
    with model.using():
        table = json_table({"columns": list(model.saved.features), "data": []}, read_spec(model.path, model.saved, False),
                           "request")
        for proba in (False, True):
            rows = model.predict_table(table, proba, (), False, new_tally())
            assert rows.shape == (0, len(model.columns(proba).names))


def test_mixed_json_cells_are_typed_as_the_same_csv_cells(models):
    """Numbers, numbers as strings, nulls, '?', booleans and words, in declared and undeclared columns,
    read from JSON as the CSV reader reads the cells that spell them (x and the text columns)."""
    model = Predictor(models["heart"], "cpu")
    rows = records(HEART_NAMES, heart_rows(count=8, start=160))
    rows[0].update(age="63", cp="4", ca="?", chol=" 230 ")
    rows[1].update(fbs=True, thal=None, slope=2.0, oldpeak="x")
    rows[2].update(fbs=False, restecg="2", ca=None)
    rows[3].update(sex=1e400, trestbps=2**80)
    with model.using():
        spec = read_spec(model.path, model.saved, False)
        table = json_table(rows, spec, "request")
        cells = [["" if v is None else str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float)
                  else str(v) for v in r.values()] for r in rows]
        reference = csv_table(csv_text(HEART_NAMES, cells), spec, "request")
    assert np.array_equal(table.x, reference.x, equal_nan=True)
    assert table.raw.text.keys() == reference.raw.text.keys()
    assert all(table.raw.text[j].tolist() == reference.raw.text[j].tolist() for j in table.raw.text)
