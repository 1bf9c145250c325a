"""`training.gradient_accumulation_steps: K`: K batches of batch_size per update give the updates of
one batch of K x batch_size (float64, SGD and Adam, an epoch's short last group included, one process
and two ranks); schedules and checkpoints count updates, and a run resumed from a checkpoint in the
middle of an epoch ends bitwise where the uninterrupted run ends."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import BLOBS_CONFIG, assert_same_weights, find_mpiexec, project, run_cli, saved_weights, train_on

FLOAT64 = BLOBS_CONFIG.replace("device: cpu\n", "device: cpu\nprecision: float64\n").replace(
    "validation_split: 0.2", "validation_split: 0.15")  # 102 training rows: the last group is short


@pytest.mark.parametrize("optimizer", ["{type: sgd, learning_rate: 0.1, momentum: 0.9}", "{type: adam, learning_rate: 0.01}"])
def test_k_batches_per_update_are_one_batch_k_times_as_large(capsys, tmp_path, optimizer):
    config = project(tmp_path, FLOAT64)
    common = ("--set", f"optimizer={optimizer}", "--set", "training.epochs=4", "-q")
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "big", "--set", "training.batch_size=32", *common)
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "acc", "--set", "training.batch_size=8",
                           "--set", "training.gradient_accumulation_steps=4", *common)
    assert code == 0, err
    assert_same_weights(tmp_path / "acc", tmp_path / "big", 1e-12)
    small = saved_weights(tmp_path / "acc")
    code, _, _ = run_cli(capsys, "train", config, "--out", tmp_path / "plain", "--set", "training.batch_size=8", *common)
    assert any(not np.allclose(small[k], v) for k, v in saved_weights(tmp_path / "plain").items())  # not batch 8
    metrics = [json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("acc", "big")]
    assert metrics[0]["validation"]["loss"] == pytest.approx(metrics[1]["validation"]["loss"], rel=1e-9)


@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec")
def test_two_ranks_accumulating_give_one_process_big_batch(tmp_path):
    config = project(tmp_path, FLOAT64)
    train_on(tmp_path / "big", ["training.batch_size=32", "training.epochs=3"], config=config)
    train_on(tmp_path / "acc", ["training.batch_size=8", "training.gradient_accumulation_steps=4", "training.epochs=3"],
             ranks=2, config=config)
    assert_same_weights(tmp_path / "acc", tmp_path / "big", 1e-12)


def test_resume_in_the_middle_of_an_epoch_counts_updates_and_is_bitwise(capsys, tmp_path):
    config = project(tmp_path, FLOAT64)
    sets = ("--set", "training.batch_size=8", "--set", "training.gradient_accumulation_steps=4", "--set",
            "training.checkpoint={every_steps: 1, keep: 100}", "--set", "training.epochs=3",
            "--set", "optimizer.schedule={type: cosine}", "-q")
    assert run_cli(capsys, "train", config, "--out", tmp_path / "whole", *sets)[0] == 0
    steps = sorted(p.name for p in (tmp_path / "whole" / "checkpoints").glob("step*.npz"))
    assert steps[-1] == "step00000012.npz"  # 102 rows, updates of 32: 4 per epoch, 3 epochs: updates counted
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    (tmp_path / "resumed" / "model.npz").unlink()
    code, _, err = run_cli(capsys, "train", config, "--resume", tmp_path / "resumed" / "checkpoints" / "step00000006.npz",
                           *sets)
    assert code == 0, err
    got, want = saved_weights(tmp_path / "resumed"), saved_weights(tmp_path / "whole")
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_asynchronous_sgd_refuses_accumulation(capsys, tmp_path):
    config = project(tmp_path)
    code, _, err = run_cli(capsys, "validate", config, "--set", "training.gradient_accumulation_steps=2",
                           "--set", "distributed.strategy=async")
    assert code == 2 and "training.gradient_accumulation_steps" in err and "accumulates nothing" in err, err
