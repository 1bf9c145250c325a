"""K-fold cross-validation from the CLI: folds against a hand computation on a tiny set, every
row held out once, folds over MPI ranks equal to one process, and the raw UCI Cleveland file
trained by its config with no hand cleaning."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, find_mpiexec, run_cli

TINY = """\
name: tiny
seed: 0
device: cpu
data: {train: tiny.csv, target: label, validation_split: 0.0}
model: {layers: [{type: dense, units: 1, activation: sigmoid, kernel_initializer: zeros}]}
loss: binary_cross_entropy
optimizer: sgd
training: {epochs: 0, checkpoint: false}
"""


def _tiny(tmp_path, labels="a" * 8 + "b" * 4):
    (tmp_path / "tiny.csv").write_text("x,label\n" + "".join(f"{i},{c}\n" for i, c in enumerate(labels)))
    (tmp_path / "c.yaml").write_text(TINY)
    return tmp_path / "c.yaml"


def test_folds_match_a_hand_computation(capsys, tmp_path):
    """Untrained zero weights output p = 0.5 for every row: the loss of every row is ln 2 and the
    prediction is the first class, 'a'. Stratified 4 folds of 8 a + 4 b hold 2 a + 1 b each, so
    each fold's held-out accuracy is 2/3 (std 0) and its MCC 0 (one class predicted)."""
    code, out, err = run_cli(capsys, "train", _tiny(tmp_path), "--folds", "4", "--out", tmp_path / "cv")
    assert code == 0, err
    metrics = json.loads((tmp_path / "cv" / "metrics.json").read_text())
    assert len(metrics["per_fold"]) == 4
    for fold in metrics["per_fold"]:
        assert fold["test"]["accuracy"] == pytest.approx(2 / 3)
        assert fold["test"]["loss"] == pytest.approx(math.log(2), rel=1e-6)
        assert fold["train"]["accuracy"] == pytest.approx(6 / 9)
    assert metrics["mean"]["test"]["accuracy"] == pytest.approx(2 / 3) and metrics["std"]["test"]["accuracy"] == 0
    assert "test mean" in out and "test std" in out
    rows = (tmp_path / "cv" / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("fold,train_loss") and len(rows) == 5
    assert not (tmp_path / "cv" / "model.npz").exists()


def test_unequal_folds_mean_and_std(capsys, tmp_path):
    """3 folds of 9 a + 3 b (stratified: 3 a + 1 b each): accuracy 3/4 in every fold; 5 folds of 10
    rows (2 per fold): a fold is 'a a' (1.0) or 'a b' (0.5)."""
    code, _, err = run_cli(capsys, "train", _tiny(tmp_path, "a" * 9 + "b" * 3), "--folds", "3", "--out", tmp_path / "k3")
    assert code == 0, err
    k3 = json.loads((tmp_path / "k3" / "metrics.json").read_text())
    assert [f["test"]["accuracy"] for f in k3["per_fold"]] == pytest.approx([0.75] * 3)
    code, out, err = run_cli(capsys, "train", _tiny(tmp_path, "a" * 7 + "b" * 3), "--folds", "5", "--out", tmp_path / "k5")
    k5 = json.loads((tmp_path / "k5" / "metrics.json").read_text())
    accuracies = np.array([f["test"]["accuracy"] for f in k5["per_fold"]])
    assert sorted(accuracies.tolist()) == [0.5, 0.5, 0.5, 1.0, 1.0]  # 3 b's: three folds hold one each
    assert k5["mean"]["test"]["accuracy"] == pytest.approx(0.7)
    assert k5["std"]["test"]["accuracy"] == pytest.approx(accuracies.std())
    said = " ".join((out + err).split())  # 5 folds, 3 rows of 'b': two folds test without it, said (it was not)
    assert "5 folds, but class 'b' has 3 rows: some folds' test rows hold none of it" in said, said
    assert "use at most 3 folds" in said
    assert "folds, but class" not in " ".join(run_cli(capsys, "train", _tiny(tmp_path, "a" * 9 + "b" * 3), "--folds",
                                                      "3", "--out", tmp_path / "k3b")[1:])


def test_folds_refuse_resume_and_separate_test_files(capsys, tmp_path):
    config = _tiny(tmp_path)
    code, _, err = run_cli(capsys, "train", config, "--folds", "3", "--resume", tmp_path / "x")
    assert code == 2 and "--folds runs a cross-validation from scratch" in err
    (tmp_path / "c.yaml").write_text(TINY.replace("validation_split: 0.0", "validation_split: 0.0, test: tiny.csv"))
    code, _, err = run_cli(capsys, "train", config, "--folds", "3", "--out", tmp_path / "cv")
    assert code == 2 and "data.validation / data.test files are not used" in err


@pytest.mark.mpi
@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec")
def test_folds_over_two_ranks_equal_one_process(tmp_path):
    config = ROOT / "configs" / "iris.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}

    def run(*extra):
        out = tmp_path / ("two" if extra else "one")
        done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--folds", "3", "--out",
                               str(out), "--set", "training.epochs=5", *extra], capture_output=True, text=True,
                              env=env, stdin=subprocess.DEVNULL, timeout=300)
        assert done.returncode == 0, done.stderr
        said = [line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("fold ")]
        assert sorted(said) == ["fold 1/3", "fold 2/3", "fold 3/3"], done.stdout  # rank 1's fold 2 too, once
        return json.loads((out / "metrics.json").read_text())
    one, two = run(), run("--processes", "2")
    assert two["processes"] == 2
    for a, b in zip(one["per_fold"], two["per_fold"]):
        assert a["test"]["accuracy"] == b["test"]["accuracy"] and a["test"]["loss"] == pytest.approx(b["test"]["loss"])


@pytest.mark.slow
def test_the_raw_uci_cleveland_file_trains_by_its_config(capsys, tmp_path):
    raw = (ROOT / "datasets" / "processed.cleveland.data").read_text()
    assert raw.count("?") == 6 and not raw.startswith("age")      # as UCI ships it: no header, ? cells
    code, out, err = run_cli(capsys, "train", ROOT / "configs" / "heart_raw.yaml", "--folds", "10", "--out",
                             tmp_path / "cv")
    assert code == 0, err
    metrics = json.loads((tmp_path / "cv" / "metrics.json").read_text())
    assert metrics["mean"]["test"]["accuracy"] >= 0.80 and metrics["mean"]["test"]["mcc"] >= 0.60
    assert "missing cells filled" in out + err


def test_search_folds_scores_trials_by_cross_validation(capsys, tmp_path):
    base = (ROOT / "configs" / "iris.yaml").read_text().replace("../datasets/iris.csv", str(ROOT / "datasets" / "iris.csv"))
    (tmp_path / "s.yaml").write_text(base + "search: {method: grid, folds: 3, space: {optimizer.learning_rate: "
                                            "[0.001, 0.05]}}\n")
    code, _, err = run_cli(capsys, "tune", tmp_path / "s.yaml", "--out", tmp_path / "search", "-q",
                           "--set", "training.epochs=8")
    assert code == 0, err
    trials = (tmp_path / "search" / "trials.csv").read_text().splitlines()
    assert "cv_std_accuracy" in trials[0] and len(trials) == 3
    header = trials[0].split(",")
    for line in trials[1:]:  # each trial's objective is the mean held-out accuracy of its folds
        row = dict(zip(header, line.split(",")))
        folds = json.loads((tmp_path / "search" / "trials" / row["trial"] / "metrics.json").read_text())
        assert float(row["val_accuracy"]) == pytest.approx(folds["mean"]["test"]["accuracy"])
        assert folds["folds"] == 3
    assert (tmp_path / "search" / "model.npz").exists()
    code, out, err = run_cli(capsys, "train", tmp_path / "search" / "best_config.yaml", "--folds", "3", "--out",
                             tmp_path / "again", "-q")
    assert code == 0, err
