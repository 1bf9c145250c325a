"""`magmadnn export` trusts nothing it did not check (issue 44, item 2): the model file's checks are
predict's, the inputs come from the model file alone, and the graph reads codes in other scripts'
digits, dates with UTC offsets and a column with an empty name as `predict` does."""

from __future__ import annotations

import csv
import io
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from test_export import MESSY, _export_and_compare, _messy_run, codes_run

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _forged(path: Path, out: Path, drop: tuple[str, ...] = (), transpose: str = "", **meta: object) -> Path:
    arrays = dict(np.load(path, allow_pickle=False))
    for key in drop:
        arrays.pop(f"weights/{key}")
    if transpose:
        arrays[f"weights/{transpose}"] = arrays[f"weights/{transpose}"].T.copy()
    if meta:
        arrays["meta"] = np.array(json.dumps(json.loads(str(arrays["meta"])) | meta))
    np.savez(out, **arrays)
    return out


@pytest.mark.parametrize("forge, said", [
    (dict(transpose="dense_0/kernel"), "'dense_0/kernel': expected shape (11, 8); received (8, 11)"),
    (dict(drop=("dense_2/bias",)), "the saved state has no 'dense_2/bias'"),
    (dict(classes=["a", "b", "c"]), "the network has 2 outputs for 3 class labels"),
    (dict(drop=("layer_norm_1/gamma", "layer_norm_1/beta")), "the saved state has no 'layer_norm_1/gamma'"),
])
def test_export_refuses_a_model_file_predict_refuses(capsys, tmp_path, forge, said):
    run = _messy_run(capsys, tmp_path, hidden="    - {type: layer_norm}\n")
    model = _forged(run / "model.npz", tmp_path / "forged.npz", **forge)
    code, _, err = run_cli(capsys, "predict", model, tmp_path / "messy.csv")
    assert code == 2 and said in err, err
    code, _, err = run_cli(capsys, "export", model, "-o", tmp_path / "m.onnx")
    assert code == 2 and f"{model}: " in err and said in err and "internal error" not in err, err
    assert not (tmp_path / "m.onnx").exists()


NUMBERS = "a,b,c,label\n" + "".join(f"{i % 7},{(i * 3) % 5},{i % 2},{'xy'[i % 3 == 0]}\n" for i in range(60))


def _numbers_run(capsys, tmp_path: Path, data: str = "") -> Path:
    (tmp_path / "n.csv").write_text(NUMBERS)
    (tmp_path / "n.yaml").write_text(
        f"name: n\nseed: 0\ndata: {{train: n.csv, target: label, validation_split: 0.0{data}}}\nmodel:\n  layers:\n"
        "    - {type: dense, units: 2, activation: softmax}\nloss: cross_entropy\noptimizer: adam\n"
        "training: {epochs: 2}\n")
    assert run_cli(capsys, "train", tmp_path / "n.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    return tmp_path / "run"


def test_the_inputs_come_from_the_model_file_not_the_training_files_header(capsys, tmp_path):
    """A column added to the training file after training (or one the model ignores) changed the
    graph's `features` input: it is the model's own columns, from the model file alone."""
    run = _numbers_run(capsys, tmp_path, data=", columns: {b: ignore}")
    lines = NUMBERS.splitlines()
    (tmp_path / "n.csv").write_text("\n".join(f"{line},{'new' if i == 0 else i}" for i, line in enumerate(lines)))
    assert run_cli(capsys, "export", run, "-o", tmp_path / "m.onnx")[0] == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    assert session.get_inputs()[0].shape == ["N", 2], session.get_inputs()[0].shape
    meta = session.get_modelmeta().custom_metadata_map
    assert json.loads(meta["input_columns"]) == {"features": ["a", "c"]} and "columns a, c " in meta["inputs"]
    _export_and_compare(capsys, run, tmp_path / "n.csv", None, "label", tmp_path / "run")


DIGITS = {"0": "\u0660", "1": "\u0661", "2": "\u0662", "3": "\u0663", "9": "\u0669"}  # Arabic-Indic


def test_codes_written_in_other_scripts_digits_read_as_predict_reads_them(capsys, tmp_path):
    """predict reads '٢' (and '२', '２', '٠٢.٠') as the code 2; the graph took them for unseen codes."""
    codes_run(capsys, tmp_path, lambda i: "ab"[(i + i // 3) % 2])
    cells = ["\u0662", "\u0663", " \u0661 ", "\u0968", "\uff13", "\u0660\u0662.\u0660", "+\u06f1", "\u0661\u0662",
             "1", "\u0662e\u0660", "\U0001d7d0", "\u0662\u0663"]  # 2, 3, 1, २, ３, ٠٢.٠, +۱, 12, ..., 𝟐
    (tmp_path / "new.csv").write_text("plan,x,label\n" + "".join(f"{c},3,a\n" for c in cells))
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv", "--proba")
    assert code == 0 and "unseen" in err, err  # 12 and 23 are unseen codes; the others are codes 1-3
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "new.csv", None, "label", tmp_path)


def test_a_number_token_in_other_scripts_digits_is_missing_in_a_text_column(capsys, tmp_path):
    _messy_run(capsys, tmp_path, data=", missing_tokens: [-999]")
    rows = MESSY.splitlines()
    (tmp_path / "tokens.csv").write_text(rows[0] + "\n34,-\u0669\u0669\u0669,yes,52000,-\u0669\u0669\u0669.\u0660,a\n"
                                         "41,red,no,61000,Oslo,b\n")
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "tokens.csv", None, "label", tmp_path)


def wall_clock_seconds(cells: list[str]) -> np.ndarray:
    """The README's recipe: ISO text as the graph's date input, its UTC offset dropped (wall-clock)."""
    bare = [re.sub(r"(?<=\d\d:\d\d)(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)$", r"\1", c.strip()) for c in cells]
    d = np.array(bare, "datetime64[ms]")
    return np.where(np.isnat(d), np.nan, d.astype(np.float64) / 1000)[:, None]


def test_dates_with_utc_offsets_are_their_wall_clock_time_in_predict_and_in_the_graph(capsys, tmp_path):
    """predict reads '2024-03-15T23:30-05:00' as 23:30 on the 15th (wall-clock, as written); the input
    the graph documents is that time too (the README's numpy recipe gave UTC: the 16th, 04:30)."""
    rng = np.random.default_rng(0)
    offsets = ["+05:00", "-08:00", "Z", "+0530", "", "-03"]
    rows = [(f"2024-{1 + i % 9:02d}-{10 + i % 18:02d}{' T'[i % 2]}{h:02d}:{i % 60:02d}{':07.25' * (i % 3 == 0)}"
             f"{offsets[i % 6]}", int(h >= 12))
            for i, h in enumerate(rng.integers(0, 24, 80))]
    (tmp_path / "d.csv").write_text("when,label\n" + "".join(f"{w},{'ab'[late]}\n" for w, late in rows))
    (tmp_path / "d.yaml").write_text(
        "name: d\nseed: 0\ndata: {train: d.csv, target: label, validation_split: 0.0, columns: {when: date}}\n"
        "model:\n  layers:\n    - {type: dense, units: 2, activation: softmax}\nloss: cross_entropy\n"
        "optimizer: {type: adam, learning_rate: 0.1}\ntraining: {epochs: 20}\n")
    assert run_cli(capsys, "train", tmp_path / "d.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    assert run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "m.onnx")[0] == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    assert "wall-clock time as written (a UTC offset or Z dropped, not applied" in onnx.load(str(tmp_path / "m.onnx")).graph.input[0].doc_string
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the recipe applies no offset (numpy warns where it would)
        probs = session.run(["probabilities"], {"when": wall_clock_seconds([w for w, _ in rows])})[0]
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "d.csv", "--proba")
    printed = np.array([[float(v) for v in r[1:]] for r in list(csv.reader(io.StringIO(out)))[1:]])
    np.testing.assert_allclose(probs, printed, atol=1e-5)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert r'(?<=\d\d:\d\d)(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)$' in readme  # the recipe tested here


@pytest.mark.parametrize("first", ["", "label", "add_3"])
def test_a_column_without_a_name_or_with_an_outputs_name_exports(capsys, tmp_path, first):
    """R's write.csv and pandas' to_csv write a row index with an empty name: the graph's input for it
    had an empty name (ValidationError); a column called 'label' clashed with the output."""
    lines = [f"{first},x,colour,y"] + [f"{(i * 3) % 7},{i % 5 / 4},{'rgb'[i % 3]},{'ab'[i % 2]}" for i in range(60)]
    (tmp_path / "e.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "e.yaml").write_text(
        "name: e\nseed: 0\ndata: {train: e.csv, target: y, validation_split: 0.0, columns: {colour: category}}\n"
        "model:\n  layers:\n    - {type: dense, units: 2, activation: softmax}\nloss: cross_entropy\n"
        "optimizer: adam\ntraining: {epochs: 1}\n")
    assert run_cli(capsys, "train", tmp_path / "e.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "e.csv", None, "y", tmp_path)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    columns = json.loads(session.get_modelmeta().custom_metadata_map["input_columns"])
    if "" in columns.values() or first:
        name = {"": "Unnamed: 0", "label": "label_input", "add_3": "add_3"}[first]
        assert columns.get(name) == first, columns
