"""`magmadnn export`: every shipped config's model, and a table with categories, booleans and missing
cells, runs in onnxruntime (an independent runtime) on the rows it trained on and gives what
`magmadnn predict` prints: probabilities within 1e-5, regression values within 1e-5 relative, the
same labels."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from conftest import ROOT, run_cli

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml")  # no CIFAR shipped; image folders: test_image_folder
                 if p.name not in ("cifar10_cnn.yaml", "digits_folder.yaml"))


def _rows(path: Path, names: list[str] | None) -> tuple[list[str], list[list[str]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    return (names, rows) if names else (rows[0], rows[1:])


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return float("nan")  # a missing cell


def _feeds(session, header: list[str], body: list[list[str]], target: str) -> dict[str, np.ndarray]:
    """The rows as the exported graph takes them: one `features` matrix of the columns its metadata
    names, or one (N, 1) input per used column (text for categories and booleans), as the metadata's
    input_columns maps inputs to columns."""
    inputs = session.get_inputs()
    columns = json.loads(session.get_modelmeta().custom_metadata_map["input_columns"])
    if [i.name for i in inputs] == ["features"]:
        keep = [header.index(name) for name in columns["features"]]
        return {"features": np.array([[_number(r[j]) for j in keep] for r in body], np.float32)}
    feeds = {}
    with np.errstate(over="ignore"):  # a number beyond float32 is fed as infinity, as a caller's cast gives
        for i in inputs:
            j = header.index(columns[i.name])
            feeds[i.name] = (np.array([[r[j]] for r in body], dtype=object) if i.type == "tensor(string)"
                             else np.array([[_number(r[j])] for r in body], np.float32))
    return feeds


def _export_and_compare(capsys, model: Path, data: Path, header_names, target: str, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "export", model, "-o", tmp_path / "m.onnx")
    assert code == 0, err
    checked = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(checked, full_check=True)
    meta = {p.key: p.value for p in checked.metadata_props}
    assert meta["magmadnn_version"] and "columns" in meta and "labels" in meta
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    header, body = _rows(data, header_names)
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, _feeds(session, header, body, target))))
    regression = "prediction" in outputs
    code, out, err = run_cli(capsys, "predict", model, data, *([] if regression else ["--proba"]))
    assert code == 0, err
    columns, *printed = list(csv.reader(io.StringIO(out)))
    if regression:
        expected = np.array([[float(v) for v in r] for r in printed])
        np.testing.assert_allclose(outputs["prediction"], expected, rtol=1e-5, atol=1e-6)
        return
    probs = [j for j, name in enumerate(columns) if name.startswith("prob_")]
    np.testing.assert_allclose(outputs["probabilities"], np.array([[float(r[j]) for j in probs] for r in printed]),
                               atol=1e-5, rtol=0)
    if "labels" in outputs:  # multi-label: a 0/1 column per label, between the set and the probabilities
        np.testing.assert_array_equal(outputs["labels"], np.array([[int(v) for v in r[1:probs[0]]] for r in printed]))
        return
    assert list(outputs["label"]) == [r[0] for r in printed]


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_exports_and_runs_in_onnxruntime_as_predict(capsys, tmp_path, name):
    from magmadnn_cli.config.loading import load_config
    config = load_config(ROOT / "configs" / name)
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / name, "--out", tmp_path / "run", "-q",
                           "--set", "training.epochs=1", "--set", "search=null")
    assert code == 0, err
    _export_and_compare(capsys, tmp_path / "run", Path(config.data.train), config.data.names, config.data.target,
                        tmp_path)


MESSY = """\
age,colour,member,income,city,label
34,red,yes,52000,Oslo,a
,green,no,61000,Bergen,b
45,blue,yes,,Oslo,a
29,red,NA,38000,Trondheim,b
52,,no,72000,Bergen,a
41,green,yes,55000,?,b
38,blue,no,47000,Oslo,a
60,red,yes,80000,Bergen,b
"""


def _messy_run(capsys, tmp_path: Path, data: str = "", hidden: str = "") -> Path:
    """A model trained on MESSY x 12 rows (categories, a boolean, missing cells; `data`: more data.*
    settings, `hidden`: layers before the output); returns its run folder."""
    rows = MESSY.splitlines()
    (tmp_path / "messy.csv").write_text("\n".join([rows[0], *(rows[1:] * 12)]) + "\n")
    (tmp_path / "c.yaml").write_text(
        "name: messy\nseed: 0\ndata: {train: messy.csv, target: label, validation_split: 0.0, "
        f"columns: {{member: boolean}}{data}}}\nmodel:\n  layers:\n    - {{type: dense, units: 8, activation: tanh}}\n"
        f"{hidden}    - {{type: dense, units: 2, activation: softmax}}\nloss: cross_entropy\n"
        "optimizer: {type: adam, learning_rate: 0.05}\ntraining: {epochs: 3, batch_size: 8}\n")
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    return tmp_path / "run"


def test_a_table_with_categories_booleans_and_missing_cells(capsys, tmp_path):
    rows = MESSY.splitlines()
    _messy_run(capsys, tmp_path, hidden="    - {type: layer_norm}\n")
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "messy.csv", None, "label", tmp_path)
    session_inputs = [i.name for i in ort.InferenceSession(str(tmp_path / "m.onnx")).get_inputs()]
    assert session_inputs == ["age", "colour", "member", "income", "city"]
    (tmp_path / "unseen.csv").write_text(rows[0] + "\n34,purple,yes,52000,Paris,a\n")  # unseen categories
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "unseen.csv", None, "label", tmp_path / "run")


def test_cells_with_spaces_around_them_read_as_predict_reads_them(capsys, tmp_path):
    """predict strips a text cell before matching it (' red ' is red, '  ' and ' NA ' are missing, ' yes'
    is true): the exported graph took ' red ' for an unseen category (all zeros), probabilities 0.55 off."""
    rows = MESSY.splitlines()
    _messy_run(capsys, tmp_path, data=", missing_tokens: [Unknown, \u00dcnbekannt, -999]")
    (tmp_path / "padded.csv").write_text(
        rows[0] + "\n34, red , yes ,52000,\tOslo,a\n45,blue\u00a0,No , , Bergen ,b\n29,  ,  NA ,38000, ? ,b\n"
        "41,\u3000green\u2003, TRUE,55000,\x1cBergen\x1f,a\n38, Red , y ,47000,Os lo,a\n"
        "52, unknown ,UNKNOWN,72000,Unknown,b\n60,\u00dcNBEKANNT,yes,-999,Oslo,a\n"
        "33,-999.0, -999 ,41000,-9.99e2,b\n")  # missing_tokens: in any case; a number token as a number
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "padded.csv", None, "label", tmp_path)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    header, body = _rows(tmp_path / "padded.csv", None)
    spaced = session.run(["probabilities"], _feeds(session, header, body, "label"))[0]
    header, body = _rows(tmp_path / "messy.csv", None)
    plain = session.run(["probabilities"], _feeds(session, header, body[:1], "label"))[0]
    np.testing.assert_allclose(spaced[0], plain[0], atol=1e-6)  # ' red ', ' yes ', '\tOslo' are row 1's cells


def test_a_cell_predict_cannot_read_gives_no_answer_not_a_wrong_one(capsys, tmp_path):
    """predict refuses a boolean cell that is neither true nor false ('maybe') and an infinite number
    (or one beyond float32); the graph cannot refuse, so such a row gets NaN probabilities and an empty
    label (it read 'maybe' as false and inf as a huge age: confident answers)."""
    rows = MESSY.splitlines()
    _messy_run(capsys, tmp_path)
    (tmp_path / "maybe.csv").write_text(rows[0] + "\n34,red,maybe,52000,Oslo,a\n")
    code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "maybe.csv")
    assert code == 2 and "'maybe'" in err, err
    unreadable = [rows[1].replace("yes", "maybe"), rows[1].replace("34", "inf"), rows[1].replace("52000", "-1e39")]
    (tmp_path / "rows.csv").write_text("\n".join([rows[0], rows[1], *unreadable, rows[2]]) + "\n")
    assert run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "m.onnx")[0] == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    header, body = _rows(tmp_path / "rows.csv", None)
    probs, labels = session.run(["probabilities", "label"], _feeds(session, header, body, "label"))
    assert np.isnan(probs[1:4]).all() and list(labels[1:4]) == [""] * 3, (probs, labels)
    assert np.isfinite(probs[[0, 4]]).all() and all(labels[[0, 4]])
    (tmp_path / "readable.csv").write_text("\n".join([rows[0], rows[1], rows[2]]) + "\n")
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "readable.csv", None, "label", tmp_path / "run")


def test_the_space_class_is_what_str_strip_removes():
    import re
    from magmadnn_cli.data.onnx_cells import SPACE
    python = re.sub(r"\\x\{([0-9A-F]+)\}", lambda m: f"\\U{int(m.group(1), 16):08X}", SPACE)  # RE2's \x{..}
    matched = {i for i in range(0x110000) if re.fullmatch(python, chr(i))}
    assert matched == {i for i in range(0x110000) if chr(i).isspace()}


def test_a_text_model_needs_opset_20(capsys, tmp_path):
    _messy_run(capsys, tmp_path)
    code, _, err = run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "m.onnx", "--opset", "18")
    assert code == 2 and "give --opset 20 or more, or leave --opset out" in err and not (tmp_path / "m.onnx").exists()
    code, _, err = run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "m.onnx")
    assert code == 0 and "opset 20" in err and onnx.load(str(tmp_path / "m.onnx")).ir_version == 9
    code, _, err = run_cli(capsys, "export", tmp_path / "run")  # no -o: beside the model file
    assert code == 0 and f"wrote {tmp_path / 'run' / 'model.onnx'} (" in err, err
    assert onnx.load(str(tmp_path / "run" / "model.onnx")).graph.input[1].name == "colour"
    code, _, err = run_cli(capsys, "export", tmp_path / "run")
    assert code == 2 and "model.onnx (the default output): exists; it is not replaced without --overwrite" in err, err
    code, _, err = run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "x.onnx", "--opset", "99")
    assert code == 2 and "--opset 99: the onnx package here" in err and not (tmp_path / "x.onnx").exists(), err
    assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q", "--overwrite")[0] == 0
    assert not (tmp_path / "run" / "model.onnx").exists()  # it described the replaced model
    assert run_cli(capsys, "export", tmp_path / "run")[0] == 0
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--resume", tmp_path / "run", "--set",
                             "training.epochs=4")  # a finished run trained on: its model.npz is rewritten
    assert code == 0 and not (tmp_path / "run" / "model.onnx").exists(), err
    assert f"removed {tmp_path / 'run' / 'model.onnx'}: exported from the model this run replaces" in out + err


def codes_run(capsys, tmp_path: Path, label: Callable[[int], str]) -> Path:
    """A run on codes.csv: a category column `plan` of codes 1-3, a number `x`, a label per row."""
    lines = ["plan,x,label"] + [f"{1 + i % 3},{i % 7},{label(i)}" for i in range(60)]
    (tmp_path / "codes.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.yaml").write_text(
        "name: codes\nseed: 0\ndata: {train: codes.csv, target: label, validation_split: 0.0, "
        "columns: {plan: category}}\nmodel:\n  layers:\n    - {type: dense, units: 2, activation: softmax}\n"
        "loss: cross_entropy\noptimizer: {type: adam, learning_rate: 0.05}\ntraining: {epochs: 2, batch_size: 8}\n")
    assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    return tmp_path / "run"


def test_a_code_column_given_text_reads_it_as_an_unseen_code(capsys, tmp_path):
    """A category column of numbers (codes) compares cells as numbers ('2.0' is code 2): a cell that is
    no number is an unseen code (all zeros) in predict; onnxruntime's Cast stopped the whole graph."""
    codes_run(capsys, tmp_path, lambda i: "ab"[i % 2])
    (tmp_path / "new.csv").write_text("plan,x,label\n 2.0 ,3,a\ngold,3,a\n0x2,3,b\n1e0,4,b\n1e999,4,b\n-1e-999,4,b\n"
                                      f"{'9' * 50},4,a\n")  # beyond a double: onnxruntime's Cast stopped
    _export_and_compare(capsys, tmp_path / "run", tmp_path / "new.csv", None, "label", tmp_path)


def test_export_refuses_an_existing_file_and_an_old_opset(capsys, tmp_path):
    (tmp_path / "m.onnx").write_text("mine")
    code, _, err = run_cli(capsys, "export", ROOT / "tests" / "missing.npz", "-o", tmp_path / "x.onnx")
    assert code == 2 and "model file not found" in err
    from conftest import project
    config = project(tmp_path)
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    code, _, err = run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "m.onnx")
    assert code == 2 and (tmp_path / "m.onnx").read_text() == "mine", err
    code, _, err = run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "n.onnx", "--opset", "13")
    assert code == 2 and "opset 17 or newer" in err and not (tmp_path / "n.onnx").exists()


def _image_run(capsys, tmp_path: Path, shape: tuple[int, ...], layers: list[str], epochs: int, seed: int) -> np.ndarray:
    """A model trained on random images of `shape` (label: the mean's sign) from an .npz, through
    `layers` then a 2-way softmax, into tmp_path/run; returns the images."""
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    np.savez(tmp_path / "img.npz", x=x, y=(x.mean(axis=(1, 2, 3)) > 0).astype(np.int64))
    (tmp_path / "img.yaml").write_text(
        "name: img\nseed: 0\ndata: {train: img.npz}\nmodel:\n  layers:\n" + "".join(f"    - {layer}\n" for layer in layers)
        + f"    - {{type: dense, units: 2, activation: softmax}}\nloss: cross_entropy\noptimizer: adam\n"
        f"training: {{epochs: {epochs}}}\n")
    assert run_cli(capsys, "train", tmp_path / "img.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    return x


def test_an_image_model_from_npz_takes_its_arrays(capsys, tmp_path):
    x = _image_run(capsys, tmp_path, (120, 1, 6, 6), ["{type: conv2d, filters: 3, kernel_size: 3, padding: same, "
                                                      "activation: relu}", "{type: pool2d, mode: avg, pool_size: 2}",
                                                      "{type: flatten}"], epochs=2, seed=0)
    assert run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "m.onnx")[0] == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    assert session.get_inputs()[0].shape == ["N", 1, 6, 6]
    probabilities, labels = session.run(None, {"features": x})
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "img.npz", "--proba")
    printed = list(csv.reader(io.StringIO(out)))[1:]
    np.testing.assert_allclose(probabilities, np.array([[float(v) for v in r[1:]] for r in printed]), atol=1e-5)
    assert list(labels) == [r[0] for r in printed]


def test_a_row_predict_refuses_gets_no_answer_whatever_its_layers_do_with_nan(capsys, tmp_path):
    """A max-pool drops a NaN that shares its window with numbers: an infinite pixel (predict refuses
    it) gave a confident label. The row's outputs are NaN and its label empty, decided at the input."""
    x = _image_run(capsys, tmp_path, (60, 1, 4, 4), ["{type: pool2d, mode: max, pool_size: 2}", "{type: flatten}"],
                   epochs=1, seed=1)
    bad = x[:3].copy()
    bad[1, 0, 0, 0] = np.inf
    np.savez(tmp_path / "bad.npz", x=bad, y=np.zeros(3, np.int64))
    code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "bad.npz")
    assert code == 2 and "inf" in err, err
    assert run_cli(capsys, "export", tmp_path / "run", "-o", tmp_path / "m.onnx")[0] == 0
    probabilities, labels = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"features": bad})
    assert np.isnan(probabilities[1]).all() and labels[1] == "" and np.isfinite(probabilities[[0, 2]]).all(), \
        (probabilities, labels)
