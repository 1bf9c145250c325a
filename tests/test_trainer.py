"""The training loop: early stopping (and restoring the best weights), divergence stops cleanly
with epoch/step named and nothing written, schedules reach the optimizer, regression and binary."""

from __future__ import annotations

import json

import numpy as np

from magmadnn_cli.config.loading import load_config
from magmadnn_cli.commands.train import train

from conftest import run_cli, write_csv


def test_early_stopping_stops_and_restores_the_best_epoch(blobs, tmp_path):
    cfg = load_config(blobs, ["training.epochs=200", "optimizer.learning_rate=0.05",
                              "training.early_stopping={monitor: val_loss, patience: 2, min_delta: 0.01}"])
    result = train(cfg, tmp_path / "run")
    history = result.history
    assert history.stopped_early and len(history.epochs) < 200
    best = history.epochs[history.best_epoch - 1]
    later = [e["val_loss"] for e in history.epochs[history.best_epoch:]]
    assert len(later) == 2 and all(v > best["val_loss"] - 0.01 for v in later)  # patience 2, then stop
    assert abs(result.metrics["validation"]["loss"] - best["val_loss"]) < 1e-5  # best weights restored
    assert history.epochs[-1]["val_loss"] != best["val_loss"]


def _keras_stop_epoch(values, patience, min_delta=0.0):
    """Keras 3's EarlyStopping.on_epoch_end, mode min, transcribed: wait += 1; an improvement (value -
    min_delta * -1 below the best: min mode negates min_delta) resets it; stop when wait >= patience
    and epoch > 0 (epochs counted from 1 here)."""
    best, wait = float("inf"), 0
    for epoch, value in enumerate(values, start=1):
        wait += 1
        if value + min_delta < best:
            best, wait = value, 0
            continue
        if wait >= patience and epoch > 1:
            return epoch
    return None


def test_early_stopping_counts_patience_as_keras_does():
    """Keras' documented example: patience 3 on a loss that never improves runs 4 epochs (the stopper
    waited one epoch more, and said 'for 3 epoch(s)' after 4)."""
    from magmadnn_cli.training.early_stopping import EarlyStopper

    class Net:
        def state_dict(self):
            return {}
    rng = np.random.default_rng(3)
    cases = [([1.0] * 10, 3, 0.0), ([1.0, 0.9, 0.95, 0.8, 0.85, 0.86, 0.7, 0.9, 0.9], 2, 0.0), ([1.0] * 5, 0, 0.0),
             ([1.0, 0.995, 0.99, 0.985, 0.98], 2, 0.01), ([float("nan")] * 6, 2, 0.0),
             ([float("nan"), 1.0, float("nan"), 0.9, float("nan"), float("nan"), 0.95], 2, 0.0)]
    cases += [(list(rng.random(30)), int(p), 0.05) for p in rng.integers(0, 6, 20)]
    for values, patience, min_delta in cases:
        stopper = EarlyStopper("val_loss", patience, min_delta, False)
        stopped = next((e for e, v in enumerate(values, 1) if stopper.update(e, {"val_loss": v}, Net())), None)
        assert stopped == _keras_stop_epoch(values, patience, min_delta), (values, patience)
    assert _keras_stop_epoch([1.0] * 10, 3) == 4


def test_a_classifier_that_predicts_one_class_for_every_row_is_said(capsys, tmp_path):
    """Noise features and a 6:1 class balance: the model predicts the common class for every row
    (MCC 0, with no word of it). Said, with the settings to try; class_weight: balanced then predicts both."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 3)), np.where(np.arange(200) % 7 == 0, "b", "a")
    write_csv(tmp_path / "n.csv", ["f1", "f2", "f3", "label"], [[*map("{:.3f}".format, r), label] for r, label in zip(x, y)])
    (tmp_path / "c.yaml").write_text(
        "name: one\nseed: 0\ndata: {train: n.csv, target: label, validation_split: 0.2}\nmodel: {layers: [{type: dense, "
        "units: 8, activation: relu}, {type: dense, units: 2, activation: softmax}]}\nloss: cross_entropy\n"
        "optimizer: {type: adam, learning_rate: 0.01}\ntraining: {epochs: 5, batch_size: 16, checkpoint: false}\n")
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "r", "-q")
    said = " ".join(err.split())
    confusion = json.loads((tmp_path / "r" / "metrics.json").read_text())["train"]["confusion_matrix"]
    assert code == 0 and [row[1] for row in confusion] == [0, 0], confusion  # every row predicted 'a'
    assert "the model predicts 'a' for every one of the 160 training rows" in said and "class_weight" in said, said
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "w", "-q",
                             "--set", "training.class_weight=balanced")
    confusion = json.loads((tmp_path / "w" / "metrics.json").read_text())["train"]["confusion_matrix"]
    assert code == 0 and all(sum(column) for column in zip(*confusion)) and "predicts" not in err, (confusion, err)


def test_early_stopping_on_accuracy_under_a_regression_loss_is_refused_at_its_key(capsys, tmp_path):
    """It never fired (a regression reports no accuracy), silently; refused when training starts and by
    validate (not when a saved model is loaded: one trained so before still predicts)."""
    write_csv(tmp_path / "r.csv", ["a", "b", "y"], [[i, i % 7, 2.0 * i - i % 7] for i in range(60)])
    (tmp_path / "c.yaml").write_text(
        "name: es\ndata: {train: r.csv, target: y, validation_split: 0.2}\n"
        "model: {layers: [{type: dense, units: 1}]}\nloss: mse\noptimizer: adam\n"
        "training:\n  epochs: 3\n  early_stopping: {monitor: val_accuracy, patience: 2}\n")
    for command in ("train", "validate"):
        code, _, err = run_cli(capsys, command, tmp_path / "c.yaml", *(["--out", tmp_path / "r"] if command == "train" else []))
        said = " ".join(err.split())
        assert code == 2 and "c.yaml:8: training.early_stopping.monitor: val_accuracy is measured for a classification " \
            "loss; loss mse reports val_loss and loss (monitor: val_loss)" in said, said
    assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "r", "--set",
                   "training.early_stopping.monitor=val_loss")[0] == 0
    model = tmp_path / "r" / "model.npz"
    with np.load(model, allow_pickle=False) as f:
        content = {k: f[k] for k in f.files}
    meta = json.loads(str(content["meta"]))
    meta["config"]["training"]["early_stopping"]["monitor"] = "val_accuracy"  # as a model trained before
    np.savez(model, **{**content, "meta": np.array(json.dumps(meta))})
    assert run_cli(capsys, "predict", model, tmp_path / "r.csv")[0] == 0


def test_divergence_names_epoch_and_step_and_writes_nothing(capsys, blobs, tmp_path):
    code, out, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "run", "--set", "optimizer.learning_rate=1e30",
                             "--set", "optimizer.type=sgd")
    assert code == 2
    assert "epoch 1, step" in err and "not finite" in err and "smaller learning rate" in err
    assert not (tmp_path / "run").exists()


def test_schedule_from_config_reaches_the_optimizer(blobs, tmp_path):
    cfg = load_config(blobs, ["training.epochs=4", "optimizer.schedule={type: step, step_size: 2, gamma: 0.5}"])
    lrs = [e["lr"] for e in train(cfg, tmp_path / "run").history.epochs]
    assert lrs == [0.01, 0.01, 0.005, 0.005]
    cfg = load_config(blobs, ["training.epochs=4", "optimizer.schedule={type: cosine, warmup_epochs: 1}"])
    lrs = [e["lr"] for e in train(cfg, tmp_path / "run2").history.epochs]
    assert lrs[0] == 0.0 and 0 < lrs[-1] < 0.01


def test_regression_and_binary_tasks_learn(tmp_path):
    r = np.random.default_rng(0)
    x = r.normal(size=(300, 3))
    write_csv(tmp_path / "reg.csv", ["a", "b", "c", "t"],
              np.c_[np.round(x, 4), np.round(2 * x[:, 0] - x[:, 1] + 0.1 * r.normal(size=300), 4)].tolist())
    (tmp_path / "reg.yaml").write_text(
        "name: reg\nseed: 0\ndata: {train: reg.csv, target: t, validation_split: 0.2}\n"
        "model: {layers: [{type: dense, units: 16, activation: tanh}, {type: dense, units: 1}]}\n"
        "loss: mse\noptimizer: {type: adam, learning_rate: 0.02}\ntraining: {epochs: 40, batch_size: 32}\n")
    metrics = train(load_config(tmp_path / "reg.yaml"), tmp_path / "r1").metrics
    assert metrics["validation"]["r2"] > 0.95
    labels = np.where(x[:, 0] + x[:, 1] > 0, "yes", "no")
    write_csv(tmp_path / "bin.csv", ["a", "b", "c", "y"], [[*np.round(row, 4), lab] for row, lab in zip(x, labels)])
    (tmp_path / "bin.yaml").write_text(
        "name: bin\nseed: 0\ndata: {train: bin.csv, target: y, validation_split: 0.2}\n"
        "model: {layers: [{type: dense, units: 8, activation: relu}, {type: dense, units: 1, activation: sigmoid}]}\n"
        "loss: binary_cross_entropy\noptimizer: {type: rmsprop, learning_rate: 0.01}\ntraining: {epochs: 30, batch_size: 16}\n")
    result = train(load_config(tmp_path / "bin.yaml"), tmp_path / "r2")
    assert result.metrics["validation"]["accuracy"] >= 0.95
    assert json.loads((tmp_path / "r2" / "metrics.json").read_text())["task"] == "binary"
