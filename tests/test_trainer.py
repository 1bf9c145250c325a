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
    assert len(later) == 3 and all(v > best["val_loss"] - 0.01 for v in later)  # patience 2, then stop
    assert abs(result.metrics["validation"]["loss"] - best["val_loss"]) < 1e-5  # best weights restored
    assert history.epochs[-1]["val_loss"] != best["val_loss"]


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
