"""Honest evaluation on small data: stratified splits and folds, class weights (against hand
computations and finite differences), a run's own test split scored again by `evaluate --split`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, check_op_grads, run_cli
from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.core.graph import Variable
from magmadnn_cli.core.graph import nn as gnn
from magmadnn_cli.data.prepare import class_weights, prepare, split_rows, stratified_order

IRIS = DataConfig(train=ROOT / "datasets" / "iris.csv", target="species", validation_split=0.2, test_split=0.2)


def _counts(split):
    return np.bincount(split.y.astype(np.int64), minlength=3).tolist()


def test_classification_splits_are_stratified_by_default():
    data = prepare(IRIS, "classification", 0)
    assert _counts(data.test) == [10, 10, 10] and _counts(data.validation) == [10, 10, 10]
    assert _counts(data.train) == [30, 30, 30]
    loose = [_counts(prepare(IRIS.model_copy(update={"stratify": False}), "classification", s).test) for s in range(5)]
    assert any(c != [10, 10, 10] for c in loose)        # the old, unstratified split (5/13/12 at seed 0...)


def test_stratified_order_is_a_permutation_that_keeps_shares_in_every_prefix():
    codes = np.array([0] * 70 + [1] * 20 + [2] * 10)
    order = stratified_order(100, 3, codes)
    assert sorted(order.tolist()) == list(range(100))
    for prefix in (10, 20, 50):
        counts = np.bincount(codes[order[:prefix]], minlength=3)
        assert np.all(np.abs(counts - prefix * np.array([0.7, 0.2, 0.1])) <= 1), (prefix, counts)


def test_folds_partition_the_rows_and_keep_class_shares():
    codes = np.array([0] * 57 + [1] * 23)
    cfg = DataConfig(train="x.csv", target="y", validation_split=0.1)
    seen = []
    for k in range(5):
        parts = split_rows(80, cfg, 0, codes, (k, 5))
        assert not set(parts["test"]) & set(parts["train"]) and not set(parts["test"]) & set(parts["validation"])
        assert len(parts["test"]) + len(parts["train"]) + len(parts["validation"]) == 80
        assert abs(np.sum(codes[parts["test"]] == 1) - 23 / 5) <= 1
        seen += parts["test"].tolist()
    assert sorted(seen) == list(range(80))              # every row held out exactly once


def test_balanced_class_weights_follow_scikit_learns_formula():
    y = np.array([0] * 6 + [1] * 3 + [2] * 1)
    np.testing.assert_allclose(class_weights("balanced", ["a", "b", "c"], y), 10 / (3 * np.array([6, 3, 1])))
    np.testing.assert_allclose(class_weights({"b": 2.5}, ["a", "b", "c"], y), [1, 2.5, 1])
    with pytest.raises(Exception, match="no class 'z'"):
        class_weights({"z": 2.0}, ["a", "b", "c"], y)


def test_weighted_cross_entropy_against_a_hand_computation_and_finite_differences(float64):
    rng = np.random.default_rng(0)
    z, y, w = rng.normal(size=(5, 3)), np.array([0, 2, 1, 2, 0]), np.array([0.5, 2.0, 3.0])
    node = gnn.SoftmaxCrossEntropy(Variable("z", z), Variable("y", y))
    node.weights = w
    from magmadnn_cli.core.graph import Graph
    (loss,) = Graph(node).forward()
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    assert float(loss) == pytest.approx(-(w[y] * logp[np.arange(5), y]).sum() / 5, rel=1e-12)

    def weighted_ce(zv):
        op = gnn.SoftmaxCrossEntropy(zv, Variable("y", y))
        op.weights = w
        return op
    check_op_grads(weighted_ce, z)

    def weighted_bce(zv):
        op = gnn.BinaryCrossEntropy(zv, Variable("t", (z[:, :1] > 0).astype(float)))
        op.weights = np.array([0.3, 4.0])
        return op
    check_op_grads(weighted_bce, z[:, :1])


def _imbalanced(tmp_path, n=400, seed=0):
    rng = np.random.default_rng(seed)
    label = (np.arange(n) % 10 == 0).astype(int)                  # 10% positives
    x = rng.normal(size=(n, 2)) + label[:, None] * 1.2           # overlapping clouds
    (tmp_path / "imb.csv").write_text("a,b,label\n" + "".join(f"{a:.4f},{b:.4f},{c}\n" for (a, b), c in zip(x, label)))


def _train_imbalanced(capsys, tmp_path, extra, out):
    (tmp_path / "c.yaml").write_text(f"""\
name: imbalanced
seed: 0
device: cpu
data: {{train: imb.csv, target: label, validation_split: 0.0, test_split: 0.0, normalize: standard}}
model: {{layers: [{{type: dense, units: 1, activation: sigmoid}}]}}
loss: binary_cross_entropy
optimizer: {{type: adam, learning_rate: 0.05}}
training: {{epochs: 30, batch_size: 32, checkpoint: false{extra}}}
""")
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / out, "-q")
    assert code == 0, err
    return json.loads((tmp_path / out / "metrics.json").read_text())["train"]["per_class"]["1"]["recall"]


def test_balanced_class_weight_raises_minority_recall(capsys, tmp_path):
    _imbalanced(tmp_path)
    plain = _train_imbalanced(capsys, tmp_path, "", "plain")
    balanced = _train_imbalanced(capsys, tmp_path, ", class_weight: balanced", "balanced")
    assert balanced > plain + 0.3, (plain, balanced)


def test_class_weight_on_a_regression_loss_is_a_config_error(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text("""\
name: r
data: {train: x.csv, target: y}
model: {layers: [{type: dense, units: 1}]}
loss: mse
optimizer: sgd
training: {class_weight: balanced}
""")
    code, _, err = run_cli(capsys, "validate", tmp_path / "c.yaml")
    assert code == 2 and "class_weight weighs classes; loss mse is a regression loss" in err


def test_evaluate_split_test_scores_exactly_the_runs_held_out_rows(capsys, tmp_path):
    config = ROOT / "configs" / "iris.yaml"
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q", "--set", "training.epochs=5")
    assert code == 0, err
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run", "--split", "test", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["rows"] == 30                          # 20% of 150 rows
    assert report["accuracy"] == saved["test"]["accuracy"] and report["loss"] == pytest.approx(saved["test"]["loss"])
    code, _, err = run_cli(capsys, "evaluate", tmp_path / "run")
    assert code == 2 and "--split" in err
