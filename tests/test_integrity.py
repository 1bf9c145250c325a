"""No silent wrong result: non-finite inputs and outputs of predict and evaluate, model files whose
metadata contradicts their weights or head, YAML merge keys as the YAML spec orders them, label_map
keys typed as the data's labels, and every image record count checked. Each case ends with exit 2
and a message saying what happened, or with the right answer; never NaN with exit 0."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import BLOBS_CONFIG, blobs_csv, run_cli


def _refused(result, *needles):
    code, out, err = result
    assert code == 2, (out, err)
    assert "Traceback" not in out + err and "Warning" not in err, err
    flat = " ".join(err.split())
    for needle in needles:
        assert needle in flat, err
    return flat


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One small blobs model (trained once for the module); tests copy it."""
    folder = tmp_path_factory.mktemp("model")
    blobs_csv(folder / "blobs.csv")
    (folder / "c.yaml").write_text(BLOBS_CONFIG)

    class Quiet:  # capsys is per test; the fixture's output goes to pytest's own capture
        def readouterr(self):
            return SimpleNamespace(out="", err="")
    code, _, _ = run_cli(Quiet(), "train", folder / "c.yaml", "--out", folder / "run", "-q",
                         "--set", "training.epochs=2")
    assert code == 0
    return folder / "run" / "model.npz"


def _model(trained, tmp_path, name="model.npz"):
    (tmp_path / name).write_bytes(trained.read_bytes())
    return tmp_path / name


def _edit_model(path, arrays=None, meta=None, raw_meta=None, config_edit=None):
    """Rewrite a model file: arrays changed, metadata replaced, or (config_edit) the last layer's
    (key, value) set in its config."""
    with np.load(path, allow_pickle=False) as f:
        content = {k: f[k] for k in f.files}
    for key, change in (arrays or {}).items():
        content[key] = change(content[key])
    old = json.loads(str(content["meta"]))
    if config_edit:
        old["config"]["model"]["layers"][-1][config_edit[0]] = config_edit[1]
    content["meta"] = np.array(raw_meta if raw_meta is not None else json.dumps(old | (meta or {})))
    np.savez(path, **content)


# -- 1. non-finite inputs and outputs --------------------------------------------------------------
@pytest.mark.parametrize("cell", ["inf", "-inf", "1e300", "-1e39"])
@pytest.mark.parametrize("command", ["predict", "predict --proba", "evaluate"])
def test_non_finite_input_cells_are_refused_naming_file_row_and_column(cell, command, trained, capsys, tmp_path):
    model = _model(trained, tmp_path)
    labelled = command == "evaluate"
    rows = ["1,2,3,4", "0.5,0.1,0.2,0.3", f"1,{cell},3,4", "4,0,0,0"]
    (tmp_path / "new.csv").write_text("f1,f2,f3,f4" + (",label" if labelled else "") + "\n"
                                      + "".join(r + (",a" if labelled else "") + "\n" for r in rows))
    words = command.split()
    out = tmp_path / "p.csv"
    args = (words[0], model, tmp_path / "new.csv", *words[1:]) + (() if labelled else ("-o", out))
    _refused(run_cli(capsys, *args), "new.csv", "column 'f2'", "data row 3")
    assert not out.exists()


def test_a_value_the_normalization_overflows_is_named_with_the_statistics(trained, capsys, tmp_path):
    """3e38 is a finite float32, but (x - shift) / spread takes it beyond float32 when spread < 1."""
    model = _model(trained, tmp_path)
    _edit_model(model, arrays={"norm/spread": lambda v: v * 0 + np.float32(0.01)})
    (tmp_path / "new.csv").write_text("f1,f2,f3,f4\n1,2,3,4\n1,2,3e38,4\n")
    _refused(run_cli(capsys, "predict", model, tmp_path / "new.csv", "-o", tmp_path / "p.csv"),
             "column 'f3', data row 2: 3e+38", "the model's input normalization", "spread 0.01")
    assert not (tmp_path / "p.csv").exists()


def test_a_non_finite_cell_in_a_later_chunk_leaves_no_output(trained, capsys, tmp_path):
    from magmadnn_cli.commands import predict as command
    model = _model(trained, tmp_path)
    (tmp_path / "new.csv").write_text("f1,f2,f3,f4\n" + "1,2,3,4\n" * 50 + "1,2,3,inf\n" + "1,2,3,4\n" * 5)
    with pytest.raises(Exception, match=r"column 'f4', data row 51"):
        command.predict(model, tmp_path / "new.csv", tmp_path / "p.csv", chunk_rows=16)
    assert not (tmp_path / "p.csv").exists() and not list(tmp_path.glob(".p.csv.*"))


def _huge_weights(path):
    """Finite weights so large that the float32 forward pass overflows for most rows."""
    _edit_model(path, arrays={f"weights/dense_{i}/kernel": lambda w: w * 1e30 for i in (0, 1)})


@pytest.mark.parametrize("command", ["predict", "predict --proba", "evaluate"])
def test_non_finite_outputs_are_refused_and_no_raw_warning_escapes(command, trained, capsys, tmp_path):
    model = _model(trained, tmp_path)
    _huge_weights(model)
    blobs_csv(tmp_path / "blobs.csv")
    words = command.split()
    out = tmp_path / "p.csv"
    args = (words[0], model, tmp_path / "blobs.csv", *words[1:]) + (() if words[0] == "evaluate" else ("-o", out))
    _refused(run_cli(capsys, *args), "model.npz", "computation overflowed", "data row(s) 1, 2")
    assert not out.exists()


# -- 2. model files whose metadata contradicts their weights and head ---------------------------------
def _deep(levels):
    return "[" * levels + "]" * levels


META_CASES = {
    "regression on a softmax head": ({"meta": {"task": "regression"}}, "task 'regression'"),
    "binary on a 3-way softmax head": ({"meta": {"task": "binary"}}, "task 'binary'"),
    "duplicate class labels": ({"meta": {"classes": ["a", "a", "b"]}}, "class labels repeat: 'a'"),
    "class labels that are not labels": ({"meta": {"classes": ["a", {"b": 1}, "c"]}}, "class label"),
    "metadata nested 100,000 deep": ({"raw_meta": _deep(100_000)}, "corrupt model file"),
    "config nested deep": ({"raw_meta": '{"config": ' + _deep(5000) + "}"}, "corrupt model file"),
    "complex kernel": ({"arrays": {"weights/dense_0/kernel": lambda w: w.astype(np.complex64)}}, "complex64"),
    "integer kernel": ({"arrays": {"weights/dense_1/kernel": lambda w: w.astype(np.int64)}}, "int64"),
    "complex normalization": ({"arrays": {"norm/spread": lambda v: v.astype(np.complex64)}}, "complex64"),
    "string sample shape": ({"meta": {"sample_shape": ["four"]}}, "corrupt model"),
    "feature names that are not names": ({"meta": {"features": [1, 2, 3, 4]}}, "feature names"),
    "a zero input scale": ({"meta": {"scale": 0}}, "input scale 0.0"),
    "metrics that are not a mapping": ({"meta": {"metrics": [1]}}, "metrics"),
    "a linear head on cross_entropy": ({"arrays": {}, "meta": None, "config_edit": ("activation", "linear")},
                                       "model.layers.1.activation"),
}


@pytest.mark.parametrize("name", sorted(META_CASES))
@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_model_metadata_must_fit_its_weights_and_head(name, command, trained, capsys, tmp_path):
    model = _model(trained, tmp_path, "bad.npz")
    edit, expected = META_CASES[name]
    _edit_model(model, **edit)
    blobs_csv(tmp_path / "blobs.csv")
    args = (command, model, tmp_path / "blobs.csv") + (("-o", tmp_path / "p.csv") if command == "predict" else ())
    flat = _refused(run_cli(capsys, *args), "bad.npz", expected)
    assert "NaN or infinity" not in flat and "pydantic" not in flat and len(flat) < 600
    assert not (tmp_path / "p.csv").exists()


def test_a_model_from_a_newer_magmadnn_names_the_settings_this_one_lacks(trained, capsys, tmp_path):
    """A model file whose config has keys this version does not know is not 'corrupt': it was
    written by a newer magmadnn, and the message says which settings and to upgrade."""
    model = _model(trained, tmp_path, "newer.npz")
    with np.load(model, allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
    meta["config"]["data"]["quantile_bins"] = 8
    meta["config"]["training"]["swa"] = {"start": 3}
    meta["magmadnn_version"] = "9.0.0"
    _edit_model(model, raw_meta=json.dumps(meta))
    blobs_csv(tmp_path / "blobs.csv")
    flat = _refused(run_cli(capsys, "predict", model, tmp_path / "blobs.csv", "-o", tmp_path / "p.csv"),
                    "newer.npz", "magmadnn 9.0.0, newer than this one", "data.quantile_bins", "training.swa", "upgrade")
    assert "corrupt" not in flat and not (tmp_path / "p.csv").exists()
    meta["config"]["data"].pop("quantile_bins"), meta["config"]["training"].pop("swa")
    meta["config"]["model"]["layers"][0]["activation"] = "swish"  # a new value, not a new key
    _edit_model(model, raw_meta=json.dumps(meta))
    _refused(run_cli(capsys, "predict", model, tmp_path / "blobs.csv"), "newer than this one", "model.layers.0.activation",
             "upgrade")
    for written_by in ("0.1.0", "0.0.1", None):  # not newer: the file is corrupt, whatever it names
        meta["magmadnn_version"] = written_by
        _edit_model(model, raw_meta=json.dumps(meta))
        flat = _refused(run_cli(capsys, "predict", model, tmp_path / "blobs.csv"), "corrupt model metadata",
                        "model.layers.0.activation")
        assert "upgrade" not in flat


def test_a_classification_task_on_a_regression_model_is_refused(capsys, tmp_path):
    blobs_csv(tmp_path / "blobs.csv")
    config = BLOBS_CONFIG.replace("units: 3, activation: softmax", "units: 1").replace(
        "target: label", "target: f4\n  features: [f1, f2, f3]").replace("cross_entropy", "mse")
    (tmp_path / "c.yaml").write_text(config)
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q",
                           "--set", "training.epochs=1")
    assert code == 0, err
    model = tmp_path / "run" / "model.npz"
    _edit_model(model, meta={"task": "classification", "classes": [0, 1]})
    _refused(run_cli(capsys, "predict", model, tmp_path / "blobs.csv"), "task 'classification'", "mse")
    _edit_model(model, meta={"task": "regression", "classes": ["x", "y"]})
    _refused(run_cli(capsys, "predict", model, tmp_path / "blobs.csv"), "regression", "class labels")
    _edit_model(model, meta={"task": "regression", "classes": [], "target_scale": {"shift": [0, 0], "spread": [1, 1]}})
    _refused(run_cli(capsys, "predict", model, tmp_path / "blobs.csv"), "target scaling has 2 values", "1 outputs")
    _edit_model(model, meta={"target_scale": {"shift": [0], "spread": [1e300]}})  # outputs overflow float32
    for command in ("predict", "evaluate"):
        _refused(run_cli(capsys, command, model, tmp_path / "blobs.csv"), "computation overflowed", "data row(s) 1")


# -- 3. YAML merge keys and the alias-expansion guard ----------------------------------------------
def test_merge_lists_take_each_key_from_the_earliest_mapping():
    from magmadnn_cli.config.yaml_source import parse_yaml
    text = ("base: &base {units: 1, activation: relu, name: base}\n"
            "wide: &wide {units: 64, kernel: he, name: wide}\n"
            "both: {<<: [*wide, *base]}\n"
            "other: {<<: [*base, *wide]}\n"
            "own: {<<: [*wide, *base], units: 7}\n"
            "one: {<<: *base, name: mine}\n")
    data, _ = parse_yaml(text, "t.yaml")
    assert data["both"] == {"units": 64, "kernel": "he", "name": "wide", "activation": "relu"}
    assert data["other"] == {"units": 1, "activation": "relu", "name": "base", "kernel": "he"}
    assert data["own"] == {"units": 7, "kernel": "he", "name": "wide", "activation": "relu"}
    assert data["one"] == {"units": 1, "activation": "relu", "name": "mine"}


def test_nested_merges_follow_the_same_order():
    from magmadnn_cli.config.yaml_source import parse_yaml
    text = ("a: &a {units: 1, rate: 0.1}\n"
            "b: &b {<<: *a, units: 2}\n"
            "c: &c {units: 3, rate: 0.3, extra: 9}\n"
            "d: {<<: [*b, *c]}\n")
    data, _ = parse_yaml(text, "t.yaml")
    assert data["d"] == {"units": 2, "rate": 0.1, "extra": 9}


def test_merge_order_reaches_the_validated_config(capsys, tmp_path):
    blobs_csv(tmp_path / "blobs.csv")
    (tmp_path / "c.yaml").write_text(BLOBS_CONFIG.replace(
        "    - {type: dense, units: 16, activation: relu}",
        "    - &first {type: dense, units: 16, activation: relu}\n"
        "    - &second {type: dense, units: 32, activation: tanh}\n"
        "    - {<<: [*second, *first], name: merged}"))
    code, out, err = run_cli(capsys, "validate", tmp_path / "c.yaml")
    assert code == 0, err
    merged = out.split("name: merged")[1].split("- name")[0]
    assert "units: 32" in merged and "activation: tanh" in merged, out


def test_a_large_plain_document_is_not_an_alias_bomb(tmp_path):
    from magmadnn_cli.config.yaml_source import parse_yaml
    text = "label_map:\n" + "".join(f"  lab{i:05d}: {i % 2}\n" for i in range(60_000))
    assert len(text) > 800_000
    data, _ = parse_yaml(text, "big.yaml")
    assert len(data["label_map"]) == 60_000


def test_alias_expansion_is_counted_not_values():
    from magmadnn_cli.config.yaml_source import parse_yaml
    from magmadnn_cli.errors import ConfigError
    table = "t: &t [" + "0," * 40_000 + "]\n"
    data, _ = parse_yaml(table + "u: [*t, *t]\n", "twice.yaml")  # 80,002 values reached through aliases
    assert len(data["u"][1]) == 40_000
    with pytest.raises(ConfigError, match="aliases expand to 120,003 values beyond those written"):
        parse_yaml(table + "u: [*t, *t, *t]\n", "thrice.yaml")
    bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 10)}]\n" for p, c in zip("abcdef", "bcdefg"))
    with pytest.raises(ConfigError, match="alias bomb"):
        parse_yaml(bomb, "bomb.yaml")


# -- 4. label_map keys typed as the data's labels ---------------------------------------------------
def _yes_no_project(tmp_path, label_map):
    r = np.random.default_rng(0)
    rows = []
    for i in range(120):
        k = i % 2
        rows.append(",".join(f"{v:.4f}" for v in np.eye(4)[k] * 4 + r.normal(size=4)) + ("," + ("yes" if k else "no")))
    (tmp_path / "yn.csv").write_text("f1,f2,f3,f4,label\n" + "\n".join(rows) + "\n")
    config = BLOBS_CONFIG.replace("blobs.csv", "yn.csv").replace("units: 3", "units: 2")
    config = config.replace("  normalize: standard\n", f"  normalize: standard\n  label_map: {label_map}\n")
    (tmp_path / "c.yaml").write_text(config)
    return tmp_path / "c.yaml"


@pytest.mark.parametrize("label_map,classes", [
    ("{no: 0, yes: 1}", [0, 1]),
    ("{'no': 0, 'yes': 1}", [0, 1]),
    ("{no: negative, yes: positive}", ["negative", "positive"]),
    ("{no: off}", ["off", "yes"]),
    ("{yes: on}", ["no", "on"]),
])
def test_label_map_keys_match_the_labels_as_written(label_map, classes, capsys, tmp_path):
    config = _yes_no_project(tmp_path, label_map)
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q", "--set", "training.epochs=1")
    assert code == 0, err
    with np.load(tmp_path / "run" / "model.npz", allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
    assert meta["classes"] == classes
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", tmp_path / "yn.csv")
    assert code == 0, err


def test_label_map_from_set_is_typed_the_same(capsys, tmp_path):
    config = _yes_no_project(tmp_path, "{}")
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q", "--set", "training.epochs=1",
                           "--set", "data.label_map={no: 0, yes: 1}")
    assert code == 0, err
    with np.load(tmp_path / "run" / "model.npz", allow_pickle=False) as f:
        assert json.loads(str(f["meta"]))["classes"] == [0, 1]


@pytest.mark.parametrize("label_map,needles", [
    ("{yess: 1}", ["data.label_map", "'yess'", "did you mean 'yes'"]),
    ("{true: 1}", ["'true'", "yes"]),
    ("{No: 0}", ["'No'", "did you mean 'no'"]),
])
def test_a_label_map_key_that_matches_no_label_is_refused(label_map, needles, capsys, tmp_path):
    config = _yes_no_project(tmp_path, label_map)
    trained = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")
    _refused(trained, *needles)
    validated = run_cli(capsys, "validate", config)
    assert validated[0] == 2 and validated[2] == trained[2]
    assert not (tmp_path / "run").exists()


def test_numeric_label_map_keys_match_numeric_labels(capsys, tmp_path):
    blobs_csv(tmp_path / "blobs.csv", labels=(1, 2, 3))
    config = BLOBS_CONFIG.replace("  normalize: standard\n", "  normalize: standard\n  label_map: {3.0: 2}\n")
    (tmp_path / "c.yaml").write_text(config.replace("units: 3", "units: 2"))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q",
                           "--set", "training.epochs=1")
    assert code == 0, err
    with np.load(tmp_path / "run" / "model.npz", allow_pickle=False) as f:
        assert json.loads(str(f["meta"]))["classes"] == [1, 2]


# -- 5. image record counts -------------------------------------------------------------------------
def _cifar_python(path, images=4, labels=4, data=None):
    x = np.arange(images * 3072, dtype=np.int64).astype(np.uint8).reshape(images, 3072) if data is None else data
    path.write_bytes(pickle.dumps({b"labels": list(range(labels)), b"data": x}, protocol=2))


def _train_on(capsys, tmp_path, data):
    config = BLOBS_CONFIG.replace("blobs.csv", data).replace("  target: label\n", "")
    (tmp_path / "c.yaml").write_text(config)
    return run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "out", "-q")


CIFAR_CASES = {
    "fewer labels than images": (dict(images=4, labels=3), ["data_batch_1", "4 images", "3 labels"]),
    "more labels than images": (dict(images=3, labels=5), ["data_batch_1", "3 images", "5 labels"]),
    "truncated pixels": (dict(data=np.zeros(18332, np.uint8)), ["data_batch_1", "18332", "3072"]),
    "rows of the wrong width": (dict(data=np.zeros((4, 100), np.uint8)), ["data_batch_1", "3072", "100"]),
    "text labels": (dict(), ["data_batch_1", "labels"]),
}


@pytest.mark.parametrize("name", sorted(CIFAR_CASES))
def test_cifar_python_record_counts_are_checked(name, capsys, tmp_path):
    kwargs, needles = CIFAR_CASES[name]
    if name == "text labels":
        (tmp_path / "data_batch_1").write_bytes(pickle.dumps(
            {b"labels": ["cat", "dog", "cat", "dog"], b"data": np.zeros((4, 3072), np.uint8)}, protocol=2))
    else:
        _cifar_python(tmp_path / "data_batch_1", **kwargs)
    _refused(_train_on(capsys, tmp_path, "data_batch_1"), *needles)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.npz"))


def _idx_bytes(dims, payload, code=0x08):
    return bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


@pytest.mark.parametrize("case", ["labels short", "payload long", "payload short", "labels two-dimensional"])
@pytest.mark.parametrize("packed", ["", ".gz"])
def test_idx_headers_and_payloads_agree(case, packed, capsys, tmp_path):
    images = _idx_bytes([4, 2, 2], bytes(16 + {"payload long": 3, "payload short": -3}.get(case, 0)))
    labels = {"labels short": _idx_bytes([3], bytes(3)), "labels two-dimensional": _idx_bytes([4, 1], bytes(4))}.get(
        case, _idx_bytes([4], bytes(4)))
    pack = gzip.compress if packed else (lambda b: b)
    (tmp_path / f"train-images-idx3-ubyte{packed}").write_bytes(pack(images))
    (tmp_path / f"train-labels-idx1-ubyte{packed}").write_bytes(pack(labels))
    _refused(_train_on(capsys, tmp_path, f"train-images-idx3-ubyte{packed}"), "idx")


IDX_VALUE_CASES = {
    "an infinite float pixel": (np.array([[[0.5, np.inf]], [[0.1, 0.2]]]), np.array([0, 1]), "image 1 holds a non-finite"),
    "fractional float labels": (np.zeros((2, 1, 2)), np.array([0.0, 1.5]), "label 2 is 1.5"),
    "no images": (np.zeros((0, 2, 2)), np.zeros(0), "holds no images"),
    "images without pixels": (np.zeros((4, 0, 2)), np.arange(4.0) % 2, "hold no pixels"),
}


@pytest.mark.parametrize("name", sorted(IDX_VALUE_CASES))
def test_idx_values_are_checked_not_cast(name, capsys, tmp_path):
    """Float IDX payloads (type 0x0D) with infinities or fractional labels: refused, not cast to int."""
    images, labels, expected = IDX_VALUE_CASES[name]

    def floats(array):
        return _idx_bytes(list(array.shape), array.astype(">f4").tobytes(), code=0x0D)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(floats(images))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(floats(labels))
    _refused(_train_on(capsys, tmp_path, "train-images-idx3-ubyte"), expected)


def test_an_empty_cifar_batch_is_refused(capsys, tmp_path):
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps({b"labels": [], b"data": np.zeros((0, 3072), np.uint8)},
                                                         protocol=4))
    _refused(_train_on(capsys, tmp_path, "data_batch_1"), "holds no images")


def test_an_idx_gz_larger_than_memory_allows_is_refused_before_allocating(tmp_path):
    """A gzip inflating to 3 GB (a tiny file) under a 2 GiB address-space limit: a clean message."""
    import subprocess
    import sys
    block = gzip.compress(bytes(1 << 24))  # gzip members concatenate: 180 of them inflate to 3 GB
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx_bytes([3000, 1000, 1000], b""))
                                                          + block * (3_000_000_000 // (1 << 24) + 1))
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx_bytes([3000], bytes(3000))))
    (tmp_path / "c.yaml").write_text(BLOBS_CONFIG.replace("blobs.csv", "train-images-idx3-ubyte.gz")
                                     .replace("  target: label\n", ""))
    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
              "sys.argv = ['magmadnn', 'validate', sys.argv[1]]\n"
              "from magmadnn_cli import cli\n"
              "cli.main()\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "c.yaml")], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "train-images-idx3-ubyte.gz" in result.stderr and "MemoryError" not in result.stderr, result.stderr
    assert "header's shape (3000, 1000, 1000) promises" in result.stderr  # refused before inflating
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("y", [np.zeros(3), np.zeros((5, 1)), np.array(1.0)])
def test_npz_x_and_y_row_counts_agree(y, capsys, tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 4), np.float32), y=y)
    _refused(_train_on(capsys, tmp_path, "d.npz"), "d.npz", "y")
