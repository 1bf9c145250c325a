"""One reader registry: every format `train` reads, `evaluate`, `predict` and `summary` read too;
a wrong feature count is one message with expected vs got in every format; data arrive in the
configured precision."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.core import backend as B
from magmadnn_cli.data.prepare import prepare
from test_imagedata import write_idx

CONFIG = """\
name: fmt
seed: 0
device: cpu
data: {{train: {train}, target: label, validation_split: 0.0, scale: 0.0039}}
model: {{layers: [{{type: flatten}}, {{type: dense, units: 3, activation: softmax}}]}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.05}}
training: {{epochs: 30, batch_size: 8, checkpoint: false}}
"""


def _images(n=30, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    images = rng.integers(0, 60, size=(n, 4, 4)) + labels[:, None, None] * 80
    return images, labels


def _write(kind, tmp_path):
    images, labels = _images()
    if kind == "idx":
        write_idx(tmp_path / "train-images-idx3-ubyte", images)
        write_idx(tmp_path / "train-labels-idx1-ubyte", labels)
        return tmp_path / "train-images-idx3-ubyte"
    if kind == "npz":
        np.savez(tmp_path / "d.npz", x=images.reshape(len(images), -1).astype(np.float32), y=labels)
        return tmp_path / "d.npz"
    rows = "".join(",".join(map(str, r)) + f",{c}\n" for r, c in zip(images.reshape(len(images), -1), labels))
    (tmp_path / "d.csv").write_text(",".join(f"p{i}" for i in range(16)) + ",label\n" + rows)
    return tmp_path / "d.csv"


@pytest.mark.parametrize("kind", ["idx", "npz", "csv"])
def test_every_format_through_every_command(kind, capsys, tmp_path):
    data = _write(kind, tmp_path)
    (tmp_path / "c.yaml").write_text(CONFIG.format(train=data))
    for command in (["validate"], ["summary"], ["train", "--out", str(tmp_path / "run"), "-q"]):
        code, out, err = run_cli(capsys, *command[:1], tmp_path / "c.yaml", *command[1:])
        assert code == 0, (command, err)
    model = tmp_path / "run" / "model.npz"
    code, out, err = run_cli(capsys, "evaluate", model, data, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["rows"] == 30 and report["accuracy"] > 0.9
    code, out, err = run_cli(capsys, "predict", model, data)
    assert code == 0, err
    predicted = out.splitlines()[1:]
    assert len(predicted) == 30
    assert np.mean([p == str(c) for p, c in zip(predicted, _images()[1])]) == pytest.approx(report["accuracy"])


@pytest.mark.parametrize("kind", ["npz", "csv"])
def test_a_wrong_feature_count_is_expected_vs_got(kind, capsys, tmp_path):
    data = _write(kind, tmp_path)
    (tmp_path / "c.yaml").write_text(CONFIG.format(train=data))
    assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    if kind == "npz":
        np.savez(tmp_path / "narrow.npz", x=np.zeros((2, 9), np.float32))
        code, _, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "narrow.npz")
        assert code == 2 and "9 feature columns; the model expects 16" in err
    else:
        (tmp_path / "narrow.csv").write_text("p0,p1\n1,2\n")
        code, _, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "narrow.csv")
        assert code == 2 and "missing feature column(s) p2, p3" in err
    assert "Traceback" not in err


def test_data_arrive_in_the_configured_precision(tmp_path):
    data = _write("csv", tmp_path)
    cfg = DataConfig(train=data, target="label", validation_split=0.0, normalize="standard")
    with B.using(B.cpu("float64")):
        assert prepare(cfg, "classification", 0).train.x.dtype == np.float64
    assert prepare(cfg, "classification", 0).train.x.dtype == np.float32
