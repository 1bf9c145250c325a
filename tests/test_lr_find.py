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


# -- issue 44, item 6 ----------------------------------------------------------------------------
@pytest.mark.parametrize("args, named", [(["--max", "inf"], "--max"), (["--min", "nan"], "--min"),
                                         (["--min", "1e-300", "--max", "1e300"], "--min"),
                                         (["--max", "1e39"], "--max"), (["--min", "1e-45"], "--min")])
def test_rates_that_are_not_finite_or_overflow_are_refused(capsys, tmp_path, args, named):
    code, out, err = run_cli(capsys, "lr-find", project(tmp_path, BLOBS_CONFIG), "--json", *args)
    text = " ".join(err.split())
    assert code == 2 and named in text and not out, err


def test_the_sweep_costs_linear_time_in_its_steps(capsys, tmp_path, monkeypatch):
    """8,000 steps took 12x 2,000: the smoothed loss was recomputed over every loss at each step.
    Counted, not timed: the losses the smoothing reads are at most a few per step."""
    from magmadnn_cli.commands import lr_find
    read = []
    smooth = lr_find._smooth
    monkeypatch.setattr(lr_find, "_smooth", lambda losses: read.append(len(losses)) or smooth(losses))
    config = project(tmp_path, BLOBS_CONFIG)
    code, out, err = run_cli(capsys, "lr-find", config, "--json", "--min", "1e-6", "--max", "1e-3", "--steps", "400")
    assert code == 0, err
    result = json.loads(out)
    assert len(result["losses"]) == 400 and sum(read) <= 2 * 400, sum(read)
    assert result["smoothed"] == pytest.approx(smooth(result["losses"]), rel=1e-12)


@pytest.mark.parametrize("target", ["c.yaml", "blobs.csv"])
def test_output_never_replaces_the_config_or_the_data_even_with_overwrite(capsys, tmp_path, target, monkeypatch):
    from magmadnn_cli.commands import lr_find
    config = project(tmp_path, BLOBS_CONFIG)
    before = (tmp_path / target).read_bytes()
    monkeypatch.setattr(lr_find, "_sweep", lambda *a: pytest.fail("the sweep ran before -o was checked"))
    code, _, err = run_cli(capsys, "lr-find", config, "-o", tmp_path / target, "--overwrite")
    assert code == 2 and str(tmp_path / target) in err and "input" in err, err
    assert (tmp_path / target).read_bytes() == before


def test_an_existing_output_is_refused_before_the_sweep(capsys, tmp_path, monkeypatch):
    from magmadnn_cli.commands import lr_find
    config = project(tmp_path, BLOBS_CONFIG)
    (tmp_path / "curve.png").write_bytes(b"mine")
    monkeypatch.setattr(lr_find, "_sweep", lambda *a: pytest.fail("the sweep ran before -o was checked"))
    code, _, err = run_cli(capsys, "lr-find", config, "-o", tmp_path / "curve.png")
    assert code == 2 and "--overwrite" in err and (tmp_path / "curve.png").read_bytes() == b"mine", err
    code, _, err = run_cli(capsys, "lr-find", config, "-o", tmp_path / "curve.gif")
    assert code == 2 and ".png" in err and not (tmp_path / "curve.gif").exists(), err


@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec")
@pytest.mark.parametrize("args", [["--max", "inf"], ["-o", "c.yaml", "--overwrite"]])
def test_an_error_under_processes_is_said_once_without_an_abort_banner(tmp_path, args):
    config = project(tmp_path, BLOBS_CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "lr-find", str(config), "--processes", "2", *args],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 2 and text.count("error:") == 1, text
    assert "Abort" not in text and "MPI_ABORT" not in text and "rank 1" not in text, text
