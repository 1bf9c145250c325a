"""Asynchronous SGD under real ranks (`distributed.strategy: async`): rank 0 serves the weights and
applies each gradient as one optimizer step, in step order; the other ranks compute gradients of
whole batches without waiting for one another, at most `max_staleness` steps behind.

References: bound 0 is one process's run exactly (every gradient taken on the current weights); a
bounded run's staleness is checked from the server's own record and its accuracy against one
process; a straggling worker takes fewer steps; a mid-epoch checkpoint of the server resumes
exactly; a failing worker ends the job."""

from __future__ import annotations

import json
import time

import pytest

from conftest import (ROOT, assert_a_failing_rank_ends_the_job, assert_same_weights,
                      assert_sigterm_to_the_launcher_stops_the_job, find_mpiexec, run_train, train_on)

MPIEXEC = find_mpiexec()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec in this environment")]
ASYNC = ["distributed.strategy=async"]
F64 = ["training.epochs=3", "precision=float64"]
STRAGGLER = (str(ROOT / "benchmarks" / "straggler.py"),)  # the CLI with one rank slowed (MAGMADNN_SLOW_RANK)


def _metrics(run) -> dict:
    return json.loads((run / "metrics.json").read_text())


def test_bound_zero_is_one_process_training(tmp_path):
    """3 ranks (server + 2 workers), bound 0: digits_mlp's dropout, Adam and early stopping's
    restore-best give one process's weights."""
    one = train_on(tmp_path / "one", F64)
    out = train_on(tmp_path / "async", [*F64, *ASYNC, "distributed.max_staleness=0"], 3)
    assert_same_weights(out, one, 1e-12)
    record = _metrics(out)["async_sgd"]
    assert record["max_staleness"] == 0 and record["staleness_max"] == 0
    assert record["steps"] == sum(record["steps_per_worker"]) == _steps(one)


def _steps(run) -> int:
    """Optimizer steps of a finished run (from its last checkpoint's name)."""
    return max(int(p.stem[4:]) for p in (run / "checkpoints").glob("step*.npz"))


def test_bound_zero_with_batchnorm_running_statistics(tmp_path):
    """The server keeps the running statistics of the worker whose step it applies."""
    overrides = ["training.epochs=1", "precision=float64", "training.batch_size=64"]
    config = ROOT / "configs" / "resnet_small.yaml"
    one = train_on(tmp_path / "one", overrides, config=config)
    out = train_on(tmp_path / "async", [*overrides, *ASYNC, "distributed.max_staleness=0"], 2, config=config)
    assert_same_weights(out, one, 1e-12)


def test_bounded_staleness_keeps_the_bound_and_the_accuracy(tmp_path):
    """Bound 3 with 3 workers: every applied gradient at most 3 steps old (the server's record), and
    the test accuracy within 2 points of one process's after the same epochs."""
    overrides = ["training.epochs=12", "training.early_stopping=null"]
    one = train_on(tmp_path / "one", overrides)
    out = train_on(tmp_path / "async", [*overrides, *ASYNC, "distributed.max_staleness=3"], 4)
    record = _metrics(out)["async_sgd"]
    assert record["workers"] == 3 and record["staleness_max"] <= 3
    assert record["steps"] == sum(record["steps_per_worker"]) == _steps(one)
    assert _metrics(out)["test"]["accuracy"] >= _metrics(one)["test"]["accuracy"] - 0.02
    assert _metrics(out)["test"]["accuracy"] > 0.9


def test_a_straggler_takes_fewer_steps_and_does_not_hold_the_others(tmp_path):
    """Worker 2 sleeps 40 ms per step (3 epochs of 40 steps): the fast worker takes most steps, and
    with the bound the straggler's gradients are never more than 10 steps old."""
    result = run_train(tmp_path / "run", ["training.epochs=3", "training.early_stopping=null", *ASYNC,
                                          "distributed.max_staleness=10"], 3, launcher=STRAGGLER,
                       extra_env={"MAGMADNN_SLOW_RANK": "2:0.04"}, quiet=False)
    assert result.returncode == 0, result.stderr
    record = _metrics(tmp_path / "run")["async_sgd"]
    fast, slow = record["steps_per_worker"]
    assert fast > 2 * slow and slow > 0 and record["staleness_max"] <= 10
    assert f"{fast} and {slow} of the {fast + slow} steps" in result.stdout  # the run log says it too


def test_a_mid_epoch_checkpoint_of_the_server_resumes_exactly(tmp_path):
    """The server writes step checkpoints while workers compute (bound 0): resuming one on one
    process ends where one process ends."""
    overrides = ["training.epochs=2", "precision=float64", "training.early_stopping=null"]
    one = train_on(tmp_path / "one", overrides)
    train_on(tmp_path / "async", [*overrides, *ASYNC, "distributed.max_staleness=0", "training.checkpoint.every_steps=7",
                                 "training.checkpoint.keep=100"], 3)
    seventh = tmp_path / "async" / "checkpoints" / "step00000007.npz"
    resumed = run_train(tmp_path / "resumed", overrides, extra=("--resume", str(seventh)))
    assert resumed.returncode == 0, resumed.stderr
    assert_same_weights(tmp_path / "resumed", one, 1e-12)


def test_one_process_trains_synchronously_with_a_warning(tmp_path):
    result = run_train(tmp_path / "run", ["training.epochs=1", *ASYNC], quiet=False)
    assert result.returncode == 0, result.stderr
    assert "strategy async needs 2 ranks or more (a server and a worker); this run has 1 process" \
        in result.stdout + result.stderr
    assert "async_sgd" not in _metrics(tmp_path / "run")


def test_a_failing_worker_ends_the_job(tmp_path):
    """A worker fails while the server waits for gradients: the job ends with its message."""
    start = time.perf_counter()
    result = run_train(tmp_path / "run", ["training.epochs=1", *ASYNC], 3, launcher=STRAGGLER,
                       extra_env={"MAGMADNN_SLOW_RANK": "1:fail"})
    assert result.returncode != 0
    assert "rank 1 failed on purpose" in result.stderr
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run" / "model.npz").exists()


def test_a_failing_server_ends_the_job(tmp_path):
    """The server fails while a worker waits for its lease."""
    assert_a_failing_rank_ends_the_job(tmp_path, (
        "import time\n"
        "from magmadnn_cli.distributed import get_communicator\n"
        "comm = get_communicator('async')\n"
        "if comm.rank == 1:\n"
        "    comm.recv(0)\n"
        "time.sleep(0.5)\n"
        "raise RuntimeError('the server broke on purpose')\n"), "the server broke on purpose")


def test_sigterm_stops_every_rank_with_a_checkpoint_that_resumes(tmp_path):
    """SIGTERM to the launcher while the server writes step checkpoints: every rank stops, the
    last checkpoint is written after the steps in flight are applied, and it resumes."""
    out = tmp_path / "run"
    assert_sigterm_to_the_launcher_stops_the_job(
        ROOT / "configs" / "digits_mlp.yaml", out, 3, ["training.epochs=400", "training.early_stopping=null",
                                                       *ASYNC, "training.checkpoint.every_steps=5"])
    resumed = run_train(out, ["training.epochs=1", "training.early_stopping=null"], extra=("--resume", str(out)))
    assert resumed.returncode == 0, resumed.stderr


def test_a_checkpoint_resumes_under_async_and_says_the_path_differs(tmp_path):
    overrides = ["training.early_stopping=null"]
    train_on(tmp_path / "run", [*overrides, "training.epochs=1"])
    resumed = run_train(tmp_path / "run", [*overrides, "training.epochs=2", *ASYNC], 3, quiet=False,
                        extra=("--resume", str(tmp_path / "run")))
    assert resumed.returncode == 0, resumed.stderr
    assert "asynchronous SGD's late gradients depend on timing, so not along the path an uninterrupted run takes" in resumed.stdout + resumed.stderr
    assert _metrics(tmp_path / "run")["async_sgd"]["steps"] == _steps(tmp_path / "run") // 2  # epoch 2's steps


def test_a_diverging_run_ends_on_every_rank_with_the_message(tmp_path):
    """The server sees the loss become non-finite: every rank stops with the divergence message
    (exit 2, no hang, no model file)."""
    start = time.perf_counter()
    result = run_train(tmp_path / "run", ["optimizer={type: sgd, learning_rate: 1.0e+30}", "training.epochs=2",
                                          *ASYNC], 3)
    assert result.returncode == 2, result.stderr
    assert "the loss became" in result.stderr and "Try a smaller learning rate" in result.stderr
    assert result.stderr.count("the loss became") == 1 and "Traceback" not in result.stderr
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run" / "model.npz").exists()
