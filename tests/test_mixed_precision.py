"""Mixed precision (`precision: mixed_bfloat16 | mixed_float16`): float32 weights and slots, matmul and
convolution operands rounded to the half type (checked against ml_dtypes and numpy's float16), summed in
float32; dynamic loss scaling for float16 on the device; real accuracy on the shipped digits."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from conftest import ROOT, run_cli
from magmadnn_cli.core import backend as B
from magmadnn_cli.nn.layers import Dense
from magmadnn_cli.nn.losses import CrossEntropy
from magmadnn_cli.nn.network import Network
from magmadnn_cli.training import loss_scale
from magmadnn_cli.training.loss_scale import LossScaler

EDGES = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3.3895314e38, 1e-45, 65504, 65520, 1.0 + 2.0 ** -8,
                  1.0 + 3 * 2.0 ** -8], np.float32)


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    spread = rng.normal(size=50_000) * 10.0 ** rng.integers(-40, 38, 50_000)
    return np.concatenate([spread.astype(np.float32), EDGES])


@pytest.mark.parametrize("precision,reference", [("mixed_bfloat16", ml_dtypes.bfloat16), ("mixed_float16", np.float16)])
def test_operands_are_rounded_to_nearest_even_in_the_half_type(precision, reference):
    a = _values()
    with B.using(B.cpu(precision)), np.errstate(over="ignore"):
        ours = B.operand(a)
        expected = a.astype(reference).astype(np.float32)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, expected)


def test_float32_and_float64_operands_are_the_arrays_themselves():
    a = _values()
    for precision in ("float32", "float64"):
        with B.using(B.cpu(precision)):
            assert B.operand(a) is a


def test_a_dense_layer_multiplies_half_operands_and_keeps_float32_weights():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 5)).astype(np.float32)
    with B.using(B.cpu("mixed_bfloat16")):
        net = Network([Dense.of(units=3, activation="linear")], (5,), CrossEntropy(), seed=0)
        out = net.predict(x)
        w, b = (p.value for p in net.parameters)
        assert w.dtype == np.float32 and net.flat_params.dtype == np.float32
    rounded = [a.astype(ml_dtypes.bfloat16).astype(np.float64) for a in (x, w)]
    np.testing.assert_allclose(out, rounded[0] @ rounded[1] + b, rtol=1e-6, atol=1e-7)
    assert not np.allclose(out, x.astype(np.float64) @ w + b, rtol=1e-6, atol=1e-7)


def test_the_loss_scaler_skips_an_overflow_halves_and_grows_after_clean_steps(monkeypatch):
    monkeypatch.setattr(loss_scale, "GROWTH_STEPS", 3)
    scaler = LossScaler()
    grads = np.full(4, 2.0 ** 15, np.float32)
    assert bool(scaler.unscale(grads, np.bool_(True)))
    np.testing.assert_array_equal(grads, 1.0)  # divided by the scale
    bad = np.array([1.0, np.inf, 0.0, 0.0], np.float32)
    assert not bool(scaler.unscale(bad, np.bool_(True)))
    assert scaler.state_dict() == {"scale": 2.0 ** 14, "clean_steps": 0}
    assert not bool(scaler.unscale(np.ones(4, np.float32), np.bool_(False)))  # a non-finite loss too
    for _ in range(3):
        assert bool(scaler.unscale(np.ones(4, np.float32), np.bool_(True)))
    assert scaler.state_dict() == {"scale": 2.0 ** 14, "clean_steps": 0}  # 2^13, doubled after 3 clean steps


def _train(capsys, out, config, precision, *sets):
    args = [a for s in (f"precision={precision}", *sets) for a in ("--set", s)]
    code, stdout, err = run_cli(capsys, "train", ROOT / "configs" / f"{config}.yaml", *args, "--out", out)
    assert code == 0, err
    return json.loads((out / "metrics.json").read_text()), stdout + err


@pytest.mark.slow
@pytest.mark.parametrize("config,sets", [("digits_mlp", ()), ("digits_cnn", ("training.epochs=8",))])
def test_mixed_modes_reach_float32s_test_accuracy(capsys, tmp_path, config, sets):
    reference, _ = _train(capsys, tmp_path / "f32", config, "float32", *sets)
    for precision in ("mixed_bfloat16", "mixed_float16"):
        metrics, log = _train(capsys, tmp_path / precision, config, precision, *sets)
        assert "emulates the GPU's numerics" in log
        assert metrics["test"]["accuracy"] >= reference["test"]["accuracy"] - 0.01, (precision, metrics["test"])


def _overflow_at(monkeypatch, step: int) -> list[int]:
    """Every run's `step`-th backward pass leaves an infinite gradient; returns the pass counter (reset
    it to [0] between runs)."""
    from magmadnn_cli.nn.network import Network as Net

    calls, forward_backward = [0], Net.forward_backward

    def overflowing(net, *args, **kwargs):
        loss = forward_backward(net, *args, **kwargs)
        calls[0] += 1
        if calls[0] == step:
            net.flat_grads[0] = np.inf
        return loss
    monkeypatch.setattr(Net, "forward_backward", overflowing)
    return calls


def test_an_injected_overflow_is_skipped_on_the_device_and_halves_the_scale(capsys, tmp_path, monkeypatch):
    """Step 5's gradients overflow: that update changes nothing, the scale ends at 2^14, and the run
    goes on (a loss scale's overflow is not a divergence)."""
    scalers, init = [], LossScaler.__init__
    _overflow_at(monkeypatch, 5)

    def kept(scaler):
        init(scaler)
        scalers.append(scaler)
    monkeypatch.setattr(LossScaler, "__init__", kept)
    metrics, _ = _train(capsys, tmp_path / "run", "digits_mlp", "mixed_float16", "training.epochs=1")
    assert scalers and scalers[-1].state_dict() == {"scale": 2.0 ** 14, "clean_steps": 40 - 5}
    assert metrics["test"]["accuracy"] > 0.5


def test_predict_evaluate_export_and_resume_a_mixed_float16_model(capsys, tmp_path):
    run = tmp_path / "run"
    _train(capsys, run, "digits_mlp", "mixed_float16", "training.epochs=2")
    whole = dict(np.load(run / "model.npz"))
    assert all(v.dtype == np.float32 for k, v in whole.items() if k.startswith("weights/"))
    code, out, err = run_cli(capsys, "predict", run, ROOT / "datasets" / "digits.csv.gz")
    assert code == 0 and len(out.splitlines()) == 1798, err
    code, out, err = run_cli(capsys, "evaluate", run, "--split", "test", "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "export", run, "-o", tmp_path / "m.onnx")
    assert code == 0, err
    # resume: 1 epoch, then on to 2, is bit for bit the 2-epoch run (the loss scale is in the checkpoint)
    half = tmp_path / "half"
    _train(capsys, half, "digits_mlp", "mixed_float16", "training.epochs=1")
    code, _, err = run_cli(capsys, "train", half / "config.yaml", "--set", "training.epochs=2", "--resume", half, "-q")
    assert code == 0, err
    resumed = dict(np.load(half / "model.npz"))
    for k in (k for k in whole if k.startswith("weights/")):
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)


def test_bench_takes_the_mixed_modes(capsys):
    code, out, err = run_cli(capsys, "bench", "--samples", "200", "--epochs", "1", "--layers", "1", "--device", "cpu",
                             "--precision", "mixed_float16", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["precision"] == "mixed_float16"
    code, _, err = run_cli(capsys, "bench", "--precision", "half")
    assert code == 2 and "mixed_bfloat16" in err


@pytest.mark.mpi
@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_two_ranks_train_as_one_process_does(tmp_path, precision):
    """As in float32 (summation order differs by rank count, so rounding does): the same test accuracy,
    weights close (a half-type rounding can flip where float32 values differ in the last bits)."""
    import os
    import subprocess
    import sys

    from conftest import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec in this environment")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    args = ["-m", "magmadnn_cli", "train", str(ROOT / "configs" / "digits_mlp.yaml"), "--set", f"precision={precision}",
            "--set", "training.epochs=3", "-q"]
    for ranks, out in ((0, "one"), (2, "two")):
        prefix = [str(mpiexec), "-n", str(ranks)] if ranks else []
        done = subprocess.run([*prefix, sys.executable, *args, "--out", str(tmp_path / out)], capture_output=True,
                              text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)
        assert done.returncode == 0, done.stderr
    metrics = [json.loads((tmp_path / out / "metrics.json").read_text())["test"]["accuracy"] for out in ("one", "two")]
    assert abs(metrics[0] - metrics[1]) <= 0.005, metrics
    with np.load(tmp_path / "one" / "model.npz") as one, np.load(tmp_path / "two" / "model.npz") as two:
        for k in (k for k in one.files if k.startswith("weights/")):
            np.testing.assert_allclose(two[k], one[k], atol=2e-2, err_msg=k)


def test_a_skipped_step_counts_alike_on_the_cpu_and_the_gpu(standin, capsys, tmp_path, monkeypatch):
    """An overflow at step 5 under mixed_float16: the CPU (a host branch) and the GPU (the kernel's own
    skip) end with the same step count and scale, and weights equal to float32 rounding."""
    from magmadnn_cli.nn.optimizer_base import Optimizer

    calls, step_counts, state_dict = _overflow_at(monkeypatch, 5), [], Optimizer.state_dict

    def recorded(opt):
        step_counts.append(opt.t)
        return state_dict(opt)
    monkeypatch.setattr(Optimizer, "state_dict", recorded)
    weights = {}
    for device in ("cpu", "gpu"):
        calls[0] = 0
        _train(capsys, tmp_path / device, "digits_mlp", "mixed_float16", "training.epochs=1", f"device={device}")
        with np.load(tmp_path / device / "model.npz") as saved:
            weights[device] = {k: saved[k] for k in saved.files if k.startswith("weights/")}
    assert step_counts[0] == step_counts[-1] == 40  # every step counted, the skipped one too
    for k in weights["cpu"]:
        np.testing.assert_allclose(weights["gpu"][k], weights["cpu"][k], atol=1e-4, err_msg=k)
