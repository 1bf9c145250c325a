"""The GPU path, proven on the CPU through the device stand-in: `device: gpu` runs the real GPU branches
end to end, and a training step neither reads from the device nor copies to it, for every shipped kind
of model and every option that touches the step (after the warm-up step, which builds what layers make
on first use). The statistics are read at most once per 50 steps."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from conftest import ROOT, run_cli
from magmadnn_cli.training import step_log
from magmadnn_cli.training.step_log import StepLog
from magmadnn_cli.training.trainer import Trainer

SMALL = ["--set", "device=gpu", "--set", "training.epochs=1", "--set", "training.early_stopping=null"]


class StepWatch:
    """Ledger tallies of everything a training step does: forming its batches, the step, keeping its
    statistics; and of every read of the step log."""

    def __init__(self, monkeypatch, standin) -> None:
        self.steps: list = []
        self.log_reads = 0
        self.ledger = standin.LEDGER
        for owner, name in ((Trainer, "micro_batches"), (Trainer, "train_step"), (StepLog, "add")):
            monkeypatch.setattr(owner, name, self._watched(getattr(owner, name)))
        read = StepLog.read

        def counted(log):
            self.log_reads += bool(len(log))
            return read(log)
        monkeypatch.setattr(StepLog, "read", counted)

    def _watched(self, fn):
        def inner(*args, **kwargs):
            with self.ledger.watch() as tally:
                result = fn(*args, **kwargs)
            self.steps.append(tally)
            return result
        return inner

    def crossings(self) -> tuple[Counter, Counter]:
        """Reads and copies of every step after the first (the warm-up, which also builds what layers
        make on first use, as a CUDA graph's warm-up step does)."""
        reads, copies = Counter(), Counter()
        for tally in self.steps[3:]:
            reads.update(tally.reads)
            copies.update(tally.copies)
        return reads, copies


CASES = {
    "mlp_adam_dropout": ("digits_mlp", []),
    "mlp_clip_norm": ("digits_mlp", ["optimizer.clip_norm=0.5"]),
    "mlp_lars": ("digits_mlp", ["optimizer={type: lars, learning_rate: 0.5, weight_decay: 0.001, momentum: 0.9}"]),
    "mlp_lamb": ("digits_mlp", ["optimizer={type: lamb, learning_rate: 0.01, weight_decay: 0.01}"]),
    "mlp_sgd_nesterov": ("digits_mlp", ["optimizer={type: sgd, learning_rate: 0.05, momentum: 0.9, nesterov: true}"]),
    "mlp_sgd_plain_decay": ("digits_mlp", ["optimizer={type: sgd, learning_rate: 0.05, weight_decay: 0.001}"]),
    "mlp_adamw": ("digits_mlp", ["optimizer={type: adamw, learning_rate: 0.003, weight_decay: 0.01}"]),
    "mlp_rmsprop": ("digits_mlp", ["optimizer={type: rmsprop, learning_rate: 0.001}"]),
    "mlp_adagrad": ("digits_mlp", ["optimizer={type: adagrad, learning_rate: 0.05}"]),
    "mlp_adamax": ("digits_mlp", ["optimizer={type: adamax, learning_rate: 0.003}"]),
    "mlp_accumulation_class_weights": ("digits_mlp", ["training.gradient_accumulation_steps=2",
                                                      "training.class_weight=balanced"]),
    "mlp_cosine_schedule": ("digits_mlp", ["optimizer.schedule={type: cosine}"]),
    "cnn_gemm_augment": ("digits_cnn", ["model.layers.0.conv_algorithm=gemm", "model.layers.2.conv_algorithm=gemm",
                                        "training.augment={crop_padding: 1, horizontal_flip: true}"]),
    "cnn_winograd": ("digits_cnn", ["model.layers.0.conv_algorithm=winograd",
                                    "model.layers.2.conv_algorithm=winograd"]),
    "cnn_fft": ("digits_cnn", ["model.layers.0.conv_algorithm=fft", "model.layers.2.conv_algorithm=fft"]),
    "resnet_batchnorm": ("resnet_small", []),
    "mlp_mixed_float16": ("digits_mlp", ["precision=mixed_float16"]),
    "cnn_mixed_bfloat16": ("digits_cnn", ["precision=mixed_bfloat16"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_step_neither_reads_from_nor_copies_to_the_device(standin, monkeypatch, capsys, tmp_path, case):
    config, settings = CASES[case]
    watch = StepWatch(monkeypatch, standin)
    sets = [arg for s in settings for arg in ("--set", s)]
    code, out, err = run_cli(capsys, "train", ROOT / "configs" / f"{config}.yaml", *SMALL, *sets,
                             "--out", tmp_path / "run", "-q")
    assert code == 0, err
    reads, copies = watch.crossings()
    assert not reads, f"device-to-host reads inside training steps: {dict(reads)}"
    assert not copies, f"host-to-device copies inside training steps: {dict(copies)}"
    steps = sum(1 for t in watch.steps) // 3
    assert steps > 0 and watch.log_reads <= math.ceil(steps / step_log.READ_EVERY) + 1


def test_statistics_are_read_once_per_50_steps_and_at_the_epoch_end(standin, monkeypatch, capsys, tmp_path):
    watch = StepWatch(monkeypatch, standin)
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_mlp.yaml", *SMALL,
                           "--set", "training.batch_size=8", "--set", "training.epochs=2",
                           "--set", "training.checkpoint=null", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    steps_per_epoch = math.ceil(1258 / 8)  # the run's training rows
    assert watch.log_reads == 2 * math.ceil(steps_per_epoch / step_log.READ_EVERY)


def test_a_non_finite_loss_stops_the_run_at_the_next_read_naming_its_step(standin, monkeypatch, capsys,
                                                                                   tmp_path):
    """Step 7's loss (and each after it) is made NaN: the run goes on to the next read of the statistics,
    then stops naming step 7, as the CPU does (a skipped update changes nothing: the fused-update test)."""
    forward_backward = __import__("magmadnn_cli.nn.network", fromlist=["Network"]).Network.forward_backward
    calls = Counter()

    def poisoned(net, x, y, *args, **kwargs):
        calls["n"] += 1
        loss = forward_backward(net, x, y, *args, **kwargs)
        return loss * float("nan") if calls["n"] >= 7 else loss
    monkeypatch.setattr("magmadnn_cli.nn.network.Network.forward_backward", poisoned)
    code, out, err = run_cli(capsys, "train", ROOT / "configs" / "digits_mlp.yaml", *SMALL, "--out", tmp_path / "run")
    assert code != 0
    assert "epoch 1, step 7: the loss became nan" in " ".join(err.split()), err


def test_device_gpu_trains_evaluates_predicts_and_resumes_on_the_standin(standin, capsys, tmp_path):
    """The user's commands with `device: gpu`: the same model as the CPU's (float64: to rounding)."""
    cfg = ROOT / "configs" / "digits_mlp.yaml"
    for device in ("gpu", "cpu"):
        code, _, err = run_cli(capsys, "train", cfg, "--set", f"device={device}", "--set", "training.epochs=2",
                               "--set", "precision=float64", "--out", tmp_path / device, "-q")
        assert code == 0, err
    with np.load(tmp_path / "gpu" / "model.npz") as g, np.load(tmp_path / "cpu" / "model.npz") as c:
        weights = [k for k in g.files if k.startswith("weights/")]
        assert weights
        for k in weights:
            np.testing.assert_allclose(g[k], c[k], rtol=1e-9, atol=1e-12, err_msg=k)
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "gpu", "--split", "test", "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "predict", tmp_path / "gpu", ROOT / "datasets" / "digits.csv.gz")
    assert code == 0 and len(out.splitlines()) == 1798, err
    code, _, err = run_cli(capsys, "train", tmp_path / "gpu" / "config.yaml", "--set", "training.epochs=3",
                           "--resume", tmp_path / "gpu", "-q")
    assert code == 0, err


OPTIMIZERS = {
    "sgd": dict(type="sgd", learning_rate=0.1, weight_decay=0.01),
    "momentum": dict(type="sgd", learning_rate=0.1, momentum=0.9, weight_decay=0.01),
    "nesterov": dict(type="sgd", learning_rate=0.1, momentum=0.9, nesterov=True),
    "adam": dict(type="adam", learning_rate=0.01, weight_decay=0.01),
    "adamw": dict(type="adamw", learning_rate=0.01, weight_decay=0.1),
    "adamax": dict(type="adamax", learning_rate=0.01, weight_decay=0.01),
    "rmsprop": dict(type="rmsprop", learning_rate=0.01, weight_decay=0.01),
    "adagrad": dict(type="adagrad", learning_rate=0.05, weight_decay=0.01),
}


def _optimizer(spec: dict):
    from magmadnn_cli.nn.optimizers import OPTIMIZERS as IMPLEMENTATIONS
    spec = dict(spec)
    return IMPLEMENTATIONS[spec.pop("type")].of(**spec)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_fused_update_is_the_published_rule_in_one_pass_and_skips_on_the_device(standin, name):
    """Five updates by the GPU's one-kernel step equal the CPU's rule (float64, to rounding); after the
    first (which makes the slots) a step allocates less new device memory than the parameters take; a
    non-finite step changes nothing."""
    from magmadnn_cli.core import backend as B

    rng = np.random.default_rng(1)
    p0, grads = rng.normal(size=300), rng.normal(size=(6, 300))
    cpu = _optimizer(OPTIMIZERS[name])
    p_cpu = p0.copy()
    for g in grads[:5]:
        cpu.step(p_cpu, g.copy())
    with B.using(B.select("gpu", "float64")):
        gpu = _optimizer(OPTIMIZERS[name])
        assert gpu.fusable()
        p_gpu = standin.asarray(p0)
        device_grads = [standin.asarray(g) for g in grads]
        gpu.step(p_gpu, device_grads[0], standin.isfinite(device_grads[0][0]))  # makes the slots
        for g in device_grads[1:5]:
            with standin.LEDGER.watch() as tally:
                gpu.step(p_gpu, g, standin.isfinite(g[0]))
            assert not tally.reads and tally.new_bytes < p_gpu.nbytes, (tally.reads, tally.new_bytes)
        np.testing.assert_allclose(p_gpu.get(), p_cpu, rtol=1e-12, atol=1e-14)
        before = (p_gpu.get(), {k: v.get() for k, v in gpu.state.items()})
        bad = device_grads[5] * float("nan")
        gpu.step(p_gpu, bad, standin.isfinite(bad[0]))
        np.testing.assert_array_equal(p_gpu.get(), before[0])
        for k, v in gpu.state.items():
            np.testing.assert_array_equal(v.get(), before[1][k])


@pytest.mark.mpi
@pytest.mark.parametrize("config,graph", [("digits_mlp", "false"), ("resnet_small", "auto")])
def test_two_gpu_ranks_reduce_through_nccl_with_no_crossing_and_give_one_process_weights(tmp_path, config, graph):
    """2 ranks, each with its own (stand-in) GPU, reduce through NCCL, eagerly or in captured steps
    (NCCL's collectives in the graph; resnet_small's batchnorm statistics summed over the ranks): no step
    reads or copies, and the model is the one process's (float64, to rounding)."""
    import json
    import os
    import subprocess
    import sys

    from conftest import STANDIN, find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec in this environment")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))} | {"CUPY_STANDIN_DEVICES": "2"}
    args = ["train", str(ROOT / "configs" / f"{config}.yaml"), "--set", "device=gpu", "--set", "precision=float64",
            "--set", "training.epochs=2", "--set", "training.early_stopping=null", "--set", f"training.cuda_graph={graph}"]
    for ranks, out in ((0, "one"), (2, "two")):
        prefix = [str(mpiexec), "-n", str(ranks)] if ranks else []
        done = subprocess.run([*prefix, sys.executable, str(STANDIN / "count_steps.py"), str(tmp_path / f"{out}.json"),
                               *args, "--out", str(tmp_path / out)], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=300)
        assert done.returncode == 0 and "runs eagerly" not in done.stdout + done.stderr, done.stderr
    for rank in (0, 1):
        counted = json.loads((tmp_path / f"two.rank{rank}.json").read_text())
        assert counted["crossings"] == [] and (graph == "auto" or counted["steps"] == 80), counted
    assert "allreduce (NCCL)" in (tmp_path / "two" / "metrics.json").read_text()
    with np.load(tmp_path / "one" / "model.npz") as one, np.load(tmp_path / "two" / "model.npz") as two:
        for k in (k for k in one.files if k.startswith("weights/")):
            np.testing.assert_allclose(two[k], one[k], rtol=1e-12, atol=1e-14, err_msg=k)


def test_device_gpu_searches_and_exports_on_the_standin(standin, capsys, tmp_path):
    code, out, err = run_cli(capsys, "tune", ROOT / "configs" / "heart_tune.yaml", "--set", "device=gpu",
                             "--set", "search.trials=2", "--set", "training.epochs=2", "--out", tmp_path / "search")
    assert code == 0, err
    assert (tmp_path / "search" / "best_config.yaml").exists() and (tmp_path / "search" / "model.npz").exists()
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", *SMALL, "--out", tmp_path / "cnn",
                           "-q")
    assert code == 0, err
    code, _, err = run_cli(capsys, "export", tmp_path / "cnn", "-o", tmp_path / "cnn.onnx")
    assert code == 0 and (tmp_path / "cnn.onnx").stat().st_size > 0, err
