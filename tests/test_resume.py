"""Checkpoints and exact resume: kill -9 / SIGTERM / SIGINT a real training at random points (also in
the middle of a checkpoint write, and under mpiexec -n 2), resume, and compare the final weights
bit for bit with an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from magmadnn_cli.training.checkpoint import prune
from magmadnn_cli.training.run_folder import checkpoint_files as listing

from conftest import ctrl_c_in_epoch, job_processes, run_cli, wait_until_gone

MPIEXEC = Path(sys.executable).parent / "mpiexec"

# Dropout, Adam, a cosine schedule and early stopping with restore_best: every kind of state a
# resumed run must get back. 1200 training rows, batch 16: 75 steps an epoch, 450 in all.
CONFIG = """\
name: resume
seed: 11
device: cpu
data:
  synthetic: {samples: 1500, features: 12, classes: 3}
  validation_split: 0.2
model:
  layers:
    - {type: dense, units: 32, activation: relu}
    - {type: dropout, rate: 0.3}
    - {type: dense, units: 3, activation: softmax}
loss: cross_entropy
optimizer: {type: adam, learning_rate: 0.01, schedule: {type: cosine, epochs: 6}}
training:
  epochs: 6
  batch_size: 16
  early_stopping: {monitor: val_loss, patience: 50, restore_best: true}
  checkpoint: {every_steps: 1, keep: 2}
"""
STEPS = 450


def _start(*args: str, ranks: int = 0) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")  # the same threads in every run: bitwise
    prefix = [str(MPIEXEC), "-n", str(ranks)] if ranks else []
    return subprocess.Popen([*prefix, sys.executable, "-m", "magmadnn_cli", "train", *args, "-q"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


def _run(*args: str, ranks: int = 0) -> subprocess.CompletedProcess:
    p = _start(*args, ranks=ranks)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _weights(run: Path) -> dict[str, np.ndarray]:
    with np.load(run / "model.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files if k.startswith("weights/")}


def _assert_same_weights(run: Path, reference: Path) -> None:
    got, want = _weights(run), _weights(reference)
    assert got.keys() == want.keys()
    for key in want:
        assert np.array_equal(got[key], want[key]), f"{key}: max diff {np.abs(got[key] - want[key]).max()}"


def _newest_step(folder: Path) -> int:
    found = listing(folder)
    return int(found[-1].stem[4:]) if found else 0


def _kill_when(p: subprocess.Popen, ready, sig: int = signal.SIGKILL) -> str | None:
    """Send `sig` to the job's process group once `ready()` holds; its stderr, or None if it ended
    first. Returns once no process of the job is left (a killed MPI rank may outlive mpiexec for a
    moment, and the run folder's lock refuses a resume while it lives)."""
    while p.poll() is None:
        if ready():
            job = job_processes(p.pid)  # mpiexec runs each rank in a session of its own
            os.killpg(p.pid, sig)
            stderr = p.communicate(timeout=60)[1]
            wait_until_gone(job, 30)
            return stderr
        time.sleep(0.002)
    p.communicate()
    return None


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    (root / "r.yaml").write_text(CONFIG)
    # The reference: no checkpoints at all, so writing them is also shown not to change the result.
    result = _run(str(root / "r.yaml"), "--out", str(root / "reference"), "--set", "training.checkpoint=null")
    assert result.returncode == 0, result.stderr
    return root


def test_kill_9_at_random_points_then_resume_is_bitwise_exact(project):
    out = project / "killed"
    config = str(project / "r.yaml")
    points = sorted(random.Random(7).sample(range(5, STEPS - 5), 3))
    for i, point in enumerate(points):
        p = _start(config, "--out", str(out), *(["--resume", str(out)] if i else []))
        assert _kill_when(p, lambda: _newest_step(out / "checkpoints") >= point) is not None, \
            f"finished before step {point}"
        assert p.returncode == -signal.SIGKILL
    result = _run(config, "--resume", str(out))
    assert result.returncode == 0, result.stderr
    _assert_same_weights(out, project / "reference")


def test_kill_9_in_the_middle_of_a_checkpoint_write(project):
    out = project / "mid-write"
    config = str(project / "r.yaml")
    folder = out / "checkpoints"

    def writing() -> bool:  # a temp file exists: the writer is between open and rename
        return folder.is_dir() and any(e.name.endswith(".tmp") for e in os.scandir(folder)) \
            and _newest_step(folder) > 20
    for _attempt in range(10):
        p = _start(config, "--out", str(out))
        if _kill_when(p, writing) is not None:
            break
    else:
        pytest.fail("never caught a checkpoint write in progress")
    assert p.returncode == -signal.SIGKILL
    result = _run(config, "--resume", str(out))
    assert result.returncode == 0, result.stderr
    _assert_same_weights(out, project / "reference")
    assert not [e for e in os.scandir(folder) if e.name.endswith(".tmp")]  # the stale temp file was swept


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_mid_epoch_and_says_how_to_resume(project, sig):
    out = project / f"signal-{sig}"
    config = str(project / "r.yaml")
    p = _start(config, "--out", str(out))
    stderr = _kill_when(p, lambda: _newest_step(out / "checkpoints") >= 100, sig)
    assert stderr is not None
    assert p.returncode == 128 + sig, stderr
    step = _newest_step(out / "checkpoints")
    assert step % 75, "the point should be mid-epoch"  # (it could land on an epoch end only by chance)
    assert f"stopped by {signal.Signals(sig).name}" in stderr and f"--resume {out}" in stderr
    assert "Traceback" not in stderr and not (out / "model.npz").exists()
    result = _run(config, "--resume", str(out))
    assert result.returncode == 0, result.stderr
    _assert_same_weights(out, project / "reference")


def test_a_signal_with_on_signal_off_stops_at_once_and_names_the_newest_checkpoint(project):
    """on_signal: false stops mid-step, writing nothing for the signal: the message says so, names
    the newest checkpoint written before, and the resume it gives is exact."""
    out = project / "at-once"
    config = str(project / "r.yaml")
    p = _start(config, "--out", str(out), "--set", "training.checkpoint.on_signal=false")
    stderr = _kill_when(p, lambda: _newest_step(out / "checkpoints") >= 100, signal.SIGINT)
    assert stderr is not None and p.returncode == 128 + signal.SIGINT, stderr
    newest = listing(out / "checkpoints")[-1]
    assert "stopped at once by SIGINT" in stderr and "on_signal is false" in stderr, stderr
    assert str(newest) in stderr and f"--resume {out}" in stderr and "Traceback" not in stderr, stderr
    result = _run(config, "--resume", str(out))
    assert result.returncode == 0, result.stderr
    _assert_same_weights(out, project / "reference")


def test_a_ctrl_c_just_after_a_checkpoint_is_renamed_names_that_checkpoint(project, capsys, monkeypatch):
    """The signal can land after a checkpoint's rename and before the writer records it (here: in
    its pruning): the message names the checkpoint on disk, the one --resume takes."""
    from magmadnn_cli import signals
    from magmadnn_cli.training import checkpoint
    real, calls = checkpoint.prune, []

    def interrupted_prune(folder, keep):
        calls.append(folder)
        if len(calls) == 3:
            signals.record(signal.SIGINT)
            raise KeyboardInterrupt
        real(folder, keep)
    monkeypatch.setattr(checkpoint, "prune", interrupted_prune)
    out = project / "ctrl-c-after-rename"
    code, _, err = run_cli(capsys, "train", project / "r.yaml", "--out", out,
                           "--set", "training.checkpoint.on_signal=false")
    assert code == 128 + signal.SIGINT, err
    newest = listing(out / "checkpoints")[-1]
    assert newest.name == "step00000003.npz" and f"the newest, written before: {newest}" in err, err


def test_a_signal_with_checkpoints_off_says_nothing_was_saved(project, capsys, monkeypatch):
    ctrl_c_in_epoch(monkeypatch, 2)
    out = project / "no-checkpoints"
    code, _, err = run_cli(capsys, "train", project / "r.yaml", "--out", out, "--set", "training.checkpoint=null")
    assert code == 128 + signal.SIGINT, err
    assert "stopped at once by SIGINT at epoch 2" in err and "checkpoints are off" in err, err
    assert "nothing of the run was saved" in err and not out.exists()  # nor a folder left holding nothing


@pytest.fixture(scope="module")
def mpi_reference(project):
    out = project / "mpi-reference"
    result = _run(str(project / "r.yaml"), "--out", str(out), "--set", "training.checkpoint=null", ranks=2)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_resume_under_mpi_is_exact(project, mpi_reference, sig):
    out = project / f"mpi-{sig}"
    config = str(project / "r.yaml")
    p = _start(config, "--out", str(out), ranks=2)
    stderr = _kill_when(p, lambda: _newest_step(out / "checkpoints") >= 150, sig)
    assert stderr is not None
    if sig == signal.SIGTERM:  # mpiexec forwards it to both ranks; they stop at the same step
        assert p.returncode == 128 + sig
        assert f"--processes 2 --resume {out}" in stderr
    result = _run(config, "--resume", str(out), ranks=2)
    assert result.returncode == 0, result.stderr
    _assert_same_weights(out, mpi_reference)


def test_resuming_on_another_rank_count_continues_the_same_training(project):
    """Dropout masks are keyed by sample position, so 2 epochs on 1 rank then 4 on 2 ranks is the
    uninterrupted 1-rank run (to float32 rounding of the summed gradients)."""
    out = project / "one-then-two"
    config = str(project / "r.yaml")
    assert _run(config, "--out", str(out), "--set", "training.epochs=2").returncode == 0
    p = _start(config, "--resume", str(out), ranks=2)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr
    assert "1 rank(s), this run has 2: training continues as it would have" in stderr.replace("\n", " ")
    assert len(listing(out / "checkpoints")) == 2
    got, want = _weights(out), _weights(project / "reference")
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-3, atol=1e-4, err_msg=key)
    metrics = json.loads((out / "metrics.json").read_text())  # how every epoch was trained, not the last part's
    first, second = metrics["segments"]
    epochs = metrics["epochs_run"]
    assert (first["epochs"], first["processes"], first["strategy"]) == ("1-2", 1, None), metrics["segments"]
    assert (second["epochs"], second["processes"]) == (f"3-{epochs}", 2) and second["strategy"], metrics["segments"]
    assert metrics["wall_time_s"] == pytest.approx(first["wall_time_s"] + second["wall_time_s"], abs=2e-3)
    assert "# trained with" in (out / "config.yaml").read_text().splitlines()[0]


def test_resume_refuses_another_architecture_naming_the_fields(project):
    out = project / "arch"
    config = str(project / "r.yaml")
    assert _run(config, "--out", str(out), "--set", "training.epochs=1").returncode == 0
    result = _run(config, "--resume", str(out), "--set", "model.layers.0.units=8",
                  "--set", "optimizer={type: sgd}")
    assert result.returncode == 2
    assert "model.layers.0.units: checkpoint 32, config 8" in result.stderr
    assert "optimizer.type: checkpoint 'adam', config 'sgd'" in result.stderr
    assert "Its weights do not fit this network (model.layers.0.units); train anew" in result.stderr, result.stderr
    assert "--init-from" not in result.stderr and "Traceback" not in result.stderr  # (it then failed on shapes)
    assert result.stdout == "" and result.stderr.startswith("error: --resume"), result.stderr  # the refusal alone
    other_optimizer = _run(config, "--resume", str(out), "--set", "optimizer={type: sgd}",
                           "--set", "model.layers.1.rate=0.1")
    assert other_optimizer.returncode == 2 and f"--init-from {out}" in other_optimizer.stderr, other_optimizer.stderr
    suggested = other_optimizer.stderr.split("--init-from ")[1].split()[0]
    started = _run(config, "--out", str(project / "arch-init"), "--init-from", suggested, "--set", "optimizer={type: sgd}",
                   "--set", "model.layers.1.rate=0.1", "--set", "training.epochs=1")
    assert started.returncode == 0, started.stderr  # the way it gives works
    other_data = _run(config, "--resume", str(out), "--set", "data.synthetic.samples=1400")
    assert other_data.returncode == 2 and "training data" in other_data.stderr and f"--init-from {out}" in other_data.stderr
    wider = _run(config, "--resume", str(out), "--set", "data.synthetic.features=7")  # the weights no longer fit
    assert wider.returncode == 2 and "Its weights do not fit this network (dense_0/kernel)" in wider.stderr, wider.stderr
    assert "--init-from" not in wider.stderr
    initialized = _run(config, "--resume", str(out), "--set", "model.layers.0.kernel_initializer=he_normal")
    assert initialized.returncode == 2 and f"--init-from {out}" in initialized.stderr, initialized.stderr
    model = _run(config, "--resume", str(out / "model.npz"))
    assert model.returncode == 2 and "a model file; --init-from takes weights only" in model.stderr
    both = _run(config, "--resume", str(out), "--init-from", str(out / "model.npz"))
    assert both.returncode == 2 and "give one of them" in both.stderr
    # a harmless change is allowed, and said
    more = _run(config, "--resume", str(out), "--set", "training.epochs=2", "--set", "optimizer.learning_rate=0.005")
    assert more.returncode == 0, more.stderr
    assert "resumed with optimizer.learning_rate: checkpoint 0.01, config 0.005" in more.stderr


def test_divergence_keeps_the_last_good_checkpoint(project):
    """The learning rate jumps 1e6-fold after two good epochs, and the loss blows up."""
    out = project / "nan"
    config = str(project / "r.yaml")
    blow_up = ("--set", "optimizer={type: sgd, learning_rate: 0.01, schedule: {type: step, step_size: 2, gamma: 1e6}}",
               "--set", "training.checkpoint.every_steps=null", "--set", "training.early_stopping=null")
    result = _run(config, "--out", str(out), *blow_up)
    assert result.returncode == 2
    assert "not finite" in result.stderr and "epoch " in result.stderr and "step " in result.stderr
    assert "Traceback" not in result.stderr and not (out / "model.npz").exists()
    kept = listing(out / "checkpoints")
    assert kept and f"The last good checkpoint is {kept[-1]}" in result.stderr.replace("\n", "")
    for path in kept:
        with np.load(path, allow_pickle=False) as f:
            assert all(np.isfinite(f[k]).all() for k in f.files if k.startswith("network/"))
    # the remedy the message suggests works: resume from it with a sane learning rate
    fixed = _run(config, "--resume", str(kept[-1]), *blow_up[:1],
                 "optimizer={type: sgd, learning_rate: 0.01}", *blow_up[2:])
    assert fixed.returncode == 0, fixed.stderr
    assert np.isfinite(np.concatenate([w.ravel() for w in _weights(out).values()])).all()


# -- units ------------------------------------------------------------------------------------
def test_prune_keeps_the_newest_and_sweeps_temp_files(tmp_path):
    for step in (3, 12, 7, 100):
        (tmp_path / f"step{step:08d}.npz").write_bytes(b"x")
    (tmp_path / ".step00000101.npz.abc.tmp").write_bytes(b"half")
    (tmp_path / "notes.txt").write_text("mine")
    prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "step00000012.npz", "step00000100.npz"]
