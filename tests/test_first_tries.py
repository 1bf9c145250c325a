"""A newcomer's first tries (issue 44, items 4, 9 and 10): settings that are wrong are said, tables
as R and pandas write them train without a second try, and the options people try first work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import BLOBS_CONFIG, project, run_cli

SMALL = BLOBS_CONFIG.replace("epochs: 15", "epochs: 2")
TWO = SMALL.replace("target: label", "target: y").replace("units: 3", "units: 2")


def _said(text: str) -> str:
    return " ".join(text.split())


def _table(folder, header: str, rows: list[str]) -> None:
    (folder / "t.csv").write_text("\n".join([header, *rows]) + "\n")
    (folder / "c.yaml").write_text(TWO.replace("blobs.csv", "t.csv"))


def _rows(n: int, cell, seed: int = 0) -> list[str]:
    r = np.random.default_rng(seed)
    return [f"{cell(i, r)},{r.normal():.3f},{'p' if r.random() < 0.5 else 'q'}" for i in range(n)]


# -- item 4: a date_format that is no strptime format ------------------------------------------------
@pytest.mark.parametrize("fmt, named", [("%Q", "'%Q'"), ("%d/%m/%Y %K", "'%K'"), ("dd/mm/yyyy", "no % code"),
                                        ("%Y-%m-%", "a lone '%' at the end")])
def test_a_date_format_that_is_no_strptime_format_is_refused_with_the_codes(capsys, tmp_path, fmt, named):
    config = project(tmp_path, SMALL.replace("normalize: standard", f"normalize: standard\n  date_format: '{fmt}'"))
    code, _, err = run_cli(capsys, "validate", config)
    text = _said(err)
    assert code == 2 and "data.date_format" in text and named in text, err
    assert "%d" in text and "%m" in text and "%Y" in text and "c.yaml:" in text, err


def test_a_real_date_format_passes(capsys, tmp_path):
    config = project(tmp_path, SMALL.replace("normalize: standard", "normalize: standard\n  date_format: '%d.%m.%Y %H:%M'"))
    assert run_cli(capsys, "validate", config)[0] == 0


# -- item 10: an unnamed first column of row numbers (R's write.csv, pandas' to_csv) -----------------
@pytest.mark.parametrize("header, first", [('"",x,y', lambda i: f'"{i + 1}"'), (",x,y", lambda i: str(i)),
                                           ("Unnamed: 0,x,y", lambda i: str(i))])
def test_an_unnamed_row_index_is_left_out_and_said(capsys, tmp_path, header, first):
    _table(tmp_path, header, _rows(120, lambda i, r: first(i)))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 0, err
    text = _said(out + err)
    assert "row index" in text and "left out" in text, text
    assert "data.columns.:" not in text
    meta = json.loads(str(np.load(tmp_path / "run" / "model.npz", allow_pickle=False)["meta"]))
    assert meta["features"] == ["x"]
    (tmp_path / "new.csv").write_text("x\n0.5\n-1\n")  # new rows without the index: predicted
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv")
    assert code == 0 and len(out.split()) == 3, err


def test_a_named_or_shuffled_number_column_is_not_taken_for_an_index(capsys, tmp_path):
    r = np.random.default_rng(3)
    order = r.permutation(120)
    _table(tmp_path, ",x,y", _rows(120, lambda i, _: str(int(order[i]) * 7)))  # not 1..n in order
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 0 and "row index" not in out + err, err
    assert "data.columns: {'': ignore}" in _said(out + err) or "data.columns.:" not in out + err


# -- item 10: dates in a format the tool identifies ---------------------------------------------------
@pytest.mark.parametrize("spell, fmt", [(lambda d: d.strftime("%Y/%m/%d"), "%Y/%m/%d"),
                                        (lambda d: d.strftime("%d.%m.%Y"), "%d.%m.%Y"),
                                        (lambda d: d.strftime("%d %b %Y"), "%d %b %Y")])
def test_dates_in_one_common_format_are_read_as_dates_saying_the_format(capsys, tmp_path, spell, fmt):
    from datetime import date, timedelta
    days = [date(2012, 1, 1) + timedelta(days=int(d)) for d in np.random.default_rng(0).permutation(400)[:120]]
    _table(tmp_path, "when,x,y", _rows(120, lambda i, r: spell(days[i])))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 0, err
    text = _said(out + err)
    assert "when (date" in text and repr(fmt) in text, text
    (tmp_path / "new.csv").write_text(f"when,x\n{spell(date(2013, 5, 17))},0.1\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv")
    assert code == 0, err


def test_dates_of_two_possible_formats_are_not_guessed(capsys, tmp_path):
    """01/02/2012: January 2 or February 1? Not guessed: the run says both formats."""
    _table(tmp_path, "when,x,y", _rows(120, lambda i, r: f"{i % 12 + 1:02d}/{i % 11 + 1:02d}/2012"))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    text = _said(out + err)
    assert "when (date" not in text and "'%m/%d/%Y'" in text and "'%d/%m/%Y'" in text, text


# -- item 10: the options people try first ------------------------------------------------------------
@pytest.mark.parametrize("shorthand, setting, shown", [("optimizer: adam", "optimizer.learning_rate=0.02", "learning_rate: 0.02"),
                                                     ("optimizer: sgd", "optimizer.momentum=0.5", "momentum: 0.5")])
def test_set_reaches_inside_a_string_shorthand(capsys, tmp_path, shorthand, setting, shown):
    config = project(tmp_path, SMALL.replace("optimizer: {type: adam, learning_rate: 0.01}", shorthand))
    code, out, err = run_cli(capsys, "validate", config, "--set", setting)
    assert code == 0, err
    assert shown in out, out


def test_set_inside_a_plain_string_is_still_refused(capsys, tmp_path):
    code, _, err = run_cli(capsys, "validate", project(tmp_path, SMALL), "--set", "name.x=1")
    assert code == 2 and "cannot set" in err, err


def test_train_takes_seed(capsys, tmp_path):
    config = project(tmp_path, SMALL)
    for run in ("a", "b"):
        code, _, err = run_cli(capsys, "train", config, "--seed", "7", "--out", tmp_path / run, "-q")
        assert code == 0, err
    assert "seed: 7" in (tmp_path / "a" / "config.yaml").read_text()
    a, b = (np.load(tmp_path / run / "model.npz", allow_pickle=False) for run in ("a", "b"))
    weights = [k for k in a.files if k.startswith("weights/")]
    assert weights and all(np.array_equal(a[k], b[k]) for k in weights)


def test_evaluate_split_test_without_one_names_the_validation_split(capsys, tmp_path):
    config = project(tmp_path, SMALL)
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    code, _, err = run_cli(capsys, "evaluate", tmp_path / "run", "--split", "test")
    assert code == 2 and "--split validation" in _said(err), err


# -- item 10: booleans said as written ----------------------------------------------------------------
def test_booleans_read_from_yes_no_are_said_as_written(capsys, tmp_path):
    words = ["yes", "no", "yes", ""]
    _table(tmp_path, "smoker,x,y", _rows(120, lambda i, r: words[i % 4]))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 0, err
    assert "smoker (boolean: yes/no)" in _said(out + err), out + err
    (tmp_path / "new.csv").write_text("smoker,x\n,0.3\nno,1\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv")
    assert code == 0 and "'yes'" in err and "'true'" not in err, err


# -- item 10: a .json array of records ---------------------------------------------------------------
def test_a_json_array_of_records_is_named_with_the_conversion(capsys, tmp_path):
    r = np.random.default_rng(0)
    records = [{"x": float(r.normal()), "y": "p" if i % 2 else "q"} for i in range(60)]
    (tmp_path / "t.json").write_text(json.dumps(records, indent=2))
    (tmp_path / "c.yaml").write_text(TWO.replace("blobs.csv", "t.json"))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    text = _said(err)
    assert code == 2 and "JSON Lines" in text and ".jsonl" in text and "internal error" not in text, err


# -- item 9: a 5,000-digit integer, a scale that overflows ---------------------------------------------
def test_a_5000_digit_integer_names_its_field(capsys, tmp_path):
    config = project(tmp_path, SMALL.replace("epochs: 2", "epochs: " + "7" * 5000))
    code, _, err = run_cli(capsys, "validate", config)
    text = _said(err)
    assert code == 2 and "training.epochs" in text and "c.yaml:16" in text and len(err) < 1000, err


@pytest.mark.parametrize("scale, precision", [("1e308", "float32"), ("1e308", "float64"), ("1e39", "float32")])
def test_a_scale_that_overflows_is_the_tools_message_without_numpy_warnings(capsys, tmp_path, scale, precision):
    config = project(tmp_path, SMALL.replace("device: cpu", f"device: cpu\nprecision: {precision}"))
    with _no_runtime_warnings():
        code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "--set", f"data.scale={scale}")
    text = _said(err)
    assert code == 2 and "data.scale" in text and "RuntimeWarning" not in text and "Traceback" not in text, err


def _no_runtime_warnings():
    import warnings
    from contextlib import contextmanager

    @contextmanager
    def guard():
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            yield
    return guard()
