"""`magmadnn lr-find`: the learning-rate range test on the config's model and data, nothing written but
what is asked for; the suggestion is the steepest descent of the smoothed loss (checked on a curve whose
steepest point is known), it stops when the loss diverges, and two ranks take one process's steps."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from magmadnn_cli.commands.lr_find import suggest

from conftest import BLOBS_CONFIG, find_mpiexec, project, run_cli


def test_the_suggestion_is_the_steepest_descent_of_the_smoothed_loss():
    rates = list(np.logspace(-6, 1, 71))  # ten points per decade
    smoothed = [1.0 - math.tanh(math.log10(r) + 2.0) for r in rates]  # falls fastest at 1e-2
    assert suggest(rates, smoothed) == pytest.approx(1e-2, rel=1e-9)
    assert suggest(rates, [1.0 + 0.01 * i for i in range(71)]) is None  # never falls: no suggestion
    assert suggest(rates[:12], smoothed[:12]) is None                    # too few steps after the skipped ones


def test_lr_find_suggests_a_rate_that_trains_and_writes_nothing_else(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, BLOBS_CONFIG.replace("optimizer: {type: adam, learning_rate: 0.01}",
                                                    "optimizer: {type: sgd, learning_rate: 0.5}"))
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tmp_path))
    code, out, err = run_cli(capsys, "lr-find", config, "--json", "-o", tmp_path / "curve.png")
    assert code == 0, err
    result = json.loads(out)
    assert set(os.listdir(tmp_path)) - before == {"curve.png"}  # no run folder, no checkpoints
    rate = result["suggested_learning_rate"]
    assert 1e-4 < rate < 5 and len(result["learning_rates"]) == len(result["losses"]) <= 100
    assert result["train_command"].endswith(f"optimizer.learning_rate={rate:.3g}")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q", "--set",
                           f"optimizer.learning_rate={rate:.3g}")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert code == 0 and metrics["validation"]["accuracy"] >= 0.9, (rate, metrics["validation"])


def test_a_diverging_loss_stops_the_sweep(capsys, tmp_path):
    config = project(tmp_path, BLOBS_CONFIG.replace("optimizer: {type: adam, learning_rate: 0.01}",
                                                    "optimizer: {type: sgd, learning_rate: 0.1}"))
    code, out, err = run_cli(capsys, "lr-find", config, "--json", "--min", "1e-3", "--max", "1e8", "--steps", "200")
    assert code == 0, err
    result = json.loads(out)
    assert result["stopped_early"] and len(result["losses"]) < 200
    assert result["learning_rates"][-1] < 1e8


@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec")
def test_two_ranks_take_one_processs_steps(tmp_path):
    config = project(tmp_path, BLOBS_CONFIG.replace("device: cpu\n", "device: cpu\nprecision: float64\n"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    args = ["-m", "magmadnn_cli", "lr-find", str(config), "--json", "--steps", "30"]
    one = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)
    two = subprocess.run([str(find_mpiexec()), "-n", "2", sys.executable, *args], capture_output=True, text=True,
                         env=env, timeout=120)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    np.testing.assert_allclose(json.loads(two.stdout)["losses"], json.loads(one.stdout)["losses"], rtol=1e-10)
