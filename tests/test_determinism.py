"""The same config and seed give the same model file, bit for bit, on a quiet or a busy machine:
`conv_algorithm: auto` is a fixed rule of the layer's shape (no timing); timing is the opt-in
`fastest`. (The same model on any rank count: test_rank_invariance runs resnet_small's auto layers.)"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from conftest import ROOT, run_cli, saved_weights
from magmadnn_cli.core.graph import convolution

CNN = ROOT / "configs" / "digits_cnn.yaml"


def _train(capsys, out, *overrides):
    code, log, err = run_cli(capsys, "train", CNN, "--out", out, "--set", "training.epochs=2",
                             *[a for o in overrides for a in ("--set", o)])
    assert code == 0, err
    return log


def test_auto_never_times_the_machine(capsys, tmp_path, monkeypatch):
    def timing(*_args, **_kwargs):
        raise AssertionError("auto timed an algorithm")
    monkeypatch.setattr(convolution, "time_algorithms", timing)
    monkeypatch.setattr("magmadnn_cli.core.graph.conv.time_algorithms", timing)
    log = _train(capsys, tmp_path / "r")
    assert "convolutions: conv2d_0 gemm (auto: the fixed rule); conv2d_2 gemm (auto: the fixed rule)" in log


def _busy_processes(count: int) -> list[subprocess.Popen]:
    """`count` processes spinning on the CPU, each running before this returns."""
    spin = "import sys; print('spinning', flush=True)\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "spinning"
    return procs


def test_a_cnn_trained_beside_busy_processes_is_bitwise_the_quiet_runs(capsys, tmp_path):
    _train(capsys, tmp_path / "quiet")
    busy = _busy_processes(2)
    try:
        _train(capsys, tmp_path / "busy")
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    quiet, loaded = saved_weights(tmp_path / "quiet"), saved_weights(tmp_path / "busy")
    assert quiet.keys() == loaded.keys() and len(quiet) == 8
    for key in quiet:
        assert np.array_equal(quiet[key], loaded[key]), key
