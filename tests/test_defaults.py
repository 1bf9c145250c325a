"""Defaults that serve a newcomer's own data: `data.normalize: auto` (the default) standardizes the
number columns of tables on the training rows and leaves images as read; choosing `none` on columns
of very different scales is said in the log, with the fix."""

from __future__ import annotations

import json

import numpy as np

from conftest import ROOT, run_cli, write_csv
from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data.prepare import prepare

MINIMAL = """\
name: {name}
seed: 0
data:
  train: {csv}
  target: diagnosis
  test_split: 0.2
{extra}model:
  layers:
    - {{type: dense, units: 16, activation: relu}}
    - {{type: dense, units: 1, activation: sigmoid}}
loss: binary_cross_entropy
optimizer: {{type: adam, learning_rate: 0.01}}
training:
  epochs: 30
  batch_size: 32
"""


def _scaled_table(tmp_path, n=200):
    """Two informative number columns around 4,000 and 0.02 (a body mass beside a ratio), a text column."""
    rng = np.random.default_rng(0)
    label = rng.integers(0, 2, n)
    mass = 4000 + 600 * label + rng.normal(0, 300, n)
    ratio = 0.02 + 0.004 * label + rng.normal(0, 0.002, n)
    colour = np.where(rng.random(n) < 0.5, "red", "blue")
    write_csv(tmp_path / "t.csv", ["mass", "ratio", "colour", "label"], zip(np.round(mass, 1), np.round(ratio, 5),
                                                                          colour, label))
    return tmp_path / "t.csv"


def test_auto_is_the_default_and_standardizes_number_columns_only(tmp_path):
    cfg = DataConfig(train=_scaled_table(tmp_path), target="label", validation_split=0.0)
    assert cfg.normalize == "auto"
    data = prepare(cfg, "classification", 0)
    x = data.train.x
    np.testing.assert_allclose(x[:, :2].mean(axis=0), 0, atol=1e-5)   # mass and ratio standardized
    np.testing.assert_allclose(x[:, :2].std(axis=0), 1, atol=1e-4)
    assert set(np.unique(x[:, 2:])) <= {0.0, 1.0}                         # the one-hot columns as they are
    assert not any("differ in scale" in n for n in data.notes)


def test_auto_leaves_images_as_the_reader_scales_them(tmp_path):
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (30, 16))
    write_csv(tmp_path / "img.csv", [f"p{i}" for i in range(16)] + ["label"],
              [[*row, i % 2] for i, row in enumerate(pixels)])
    data = prepare(DataConfig(train=tmp_path / "img.csv", target="label", shape=[1, 4, 4], scale=1 / 255,
                              validation_split=0.0), "classification", 0)
    assert data.train.x.shape[1:] == (1, 4, 4)
    assert data.train.x.min() >= 0 and data.train.x.max() <= 1.0 and data.train.x.max() > 0.9   # scaled only


def test_auto_leaves_features_the_config_scales_itself_as_scaled(tmp_path):
    """Pixel rows without data.shape (an MLP on MNIST): data.scale says how they are scaled."""
    data = prepare(DataConfig(train=_scaled_table(tmp_path), target="label", validation_split=0.0, scale=0.5,
                              columns={"colour": "ignore"}), "classification", 0)
    raw = prepare(DataConfig(train=_scaled_table(tmp_path), target="label", validation_split=0.0,
                             normalize="none", columns={"colour": "ignore"}), "classification", 0)
    np.testing.assert_allclose(data.train.x, raw.train.x * 0.5, rtol=1e-6)


def test_none_on_columns_of_very_different_scales_is_said_with_the_fix(tmp_path):
    data = prepare(DataConfig(train=_scaled_table(tmp_path), target="label", validation_split=0.0, normalize="none"),
                   "classification", 0)
    [note] = [n for n in data.notes if "differ in scale" in n]
    assert "widest: mass" in note and "narrowest: ratio" in note and "data.normalize: standard" in note
    same_scale = prepare(DataConfig(train=_scaled_table(tmp_path), target="label", validation_split=0.0,
                                    normalize="none", columns={"mass": "ignore"}), "classification", 0)
    assert not any("differ in scale" in n for n in same_scale.notes)   # one number column: nothing to compare


def _test_accuracy(capsys, tmp_path, name, extra):
    config = tmp_path / f"{name}.yaml"
    config.write_text(MINIMAL.format(name=name, csv=ROOT / "datasets" / "breast_cancer.csv", extra=extra))
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / name, "-q")
    assert code == 0, err
    return json.loads((tmp_path / name / "metrics.json").read_text())["test"]["accuracy"]


def test_a_minimal_config_trains_as_well_as_one_that_asks_for_standardization(capsys, tmp_path):
    """Breast cancer's columns run from 0.001 (fractal dimension SE) to 4,000 (worst area)."""
    minimal = _test_accuracy(capsys, tmp_path, "minimal", "")
    standard = _test_accuracy(capsys, tmp_path, "standard", "  normalize: standard\n")
    assert minimal >= 0.94 and abs(minimal - standard) <= 0.02, (minimal, standard)
