"""Run-folder locks on a shared file system: the lock says which host, process and Slurm job holds the
folder; a requeued Slurm job (same job id, a higher SLURM_RESTART_COUNT, maybe on another node) takes
over the lock its earlier incarnation left; any other holder on another host is named, with the fix."""

from __future__ import annotations

import json
import os
import socket

import pytest

from magmadnn_cli.training.run_folder import FolderLock, RunFolder
from magmadnn_cli.errors import MagmaError

LOCK = RunFolder.LOCK


@pytest.fixture
def no_slurm(monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _left_by(folder, host: str, pid: int = 4242, job: str | None = None, restart: int = 0) -> None:
    """The lock a run on `host` left when its node died."""
    folder.mkdir(parents=True, exist_ok=True)
    holder = {"pid": pid, "host": host, **({"slurm_job": job, "slurm_restart": restart} if job else {})}
    (folder / LOCK).write_text(json.dumps(holder))


def test_the_lock_records_host_pid_and_slurm_job(tmp_path, no_slurm):
    no_slurm.setenv("SLURM_JOB_ID", "777")
    no_slurm.setenv("SLURM_RESTART_COUNT", "2")
    with FolderLock(tmp_path / "run", "run"):
        held = json.loads((tmp_path / "run" / LOCK).read_text())
    started = held.pop("started")  # the process's start (clock ticks since boot): a reused PID is told apart
    assert held == {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job": "777", "slurm_restart": 2}
    assert started == int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19])


def test_a_requeued_slurm_job_takes_over_its_own_lock_from_another_node(tmp_path, no_slurm):
    _left_by(tmp_path / "run", "node-that-died", job="777", restart=0)
    no_slurm.setenv("SLURM_JOB_ID", "777")
    no_slurm.setenv("SLURM_RESTART_COUNT", "1")
    with FolderLock(tmp_path / "run", "run"):
        held = json.loads((tmp_path / "run" / LOCK).read_text())
    assert held["host"] == socket.gethostname() and held["pid"] == os.getpid() and held["slurm_restart"] == 1


@pytest.mark.parametrize("ours", [None, "778"])
def test_another_jobs_lock_on_another_host_is_named_with_the_fix(tmp_path, no_slurm, ours):
    _left_by(tmp_path / "run", "node7", pid=99, job="777")
    if ours:
        no_slurm.setenv("SLURM_JOB_ID", ours)
    with pytest.raises(MagmaError) as caught:
        FolderLock(tmp_path / "run", "run").__enter__()
    message = str(caught.value)
    assert "node7" in message and "PID 99" in message and "Slurm job 777" in message
    assert f"this run is on {socket.gethostname()}" + (f" in Slurm job {ours}" if ours else "") in message, message
    assert "squeue -j 777" in message and f"remove {tmp_path / 'run' / LOCK}" in message
    assert (tmp_path / "run" / LOCK).exists()  # not taken


def test_the_same_job_at_the_same_restart_on_another_host_is_a_concurrent_step_not_a_requeue(tmp_path, no_slurm):
    _left_by(tmp_path / "run", "node7", job="777", restart=1)
    no_slurm.setenv("SLURM_JOB_ID", "777")
    no_slurm.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(MagmaError, match="node7.*Slurm job 777.*another step of this job"):
        FolderLock(tmp_path / "run", "run").__enter__()


def test_a_lock_from_another_host_without_slurm_is_named_with_the_fix(tmp_path, no_slurm):
    _left_by(tmp_path / "run", "node7", pid=99)
    with pytest.raises(MagmaError) as caught:
        FolderLock(tmp_path / "run", "run").__enter__()
    assert "on node7 (PID 99)" in str(caught.value) and f"remove {tmp_path / 'run' / LOCK}" in str(caught.value)


def test_a_requeued_job_on_the_same_node_takes_over_though_its_old_pid_now_runs_something_else(tmp_path, no_slurm):
    """Requeued onto the node it ran on, where its old PID now belongs to another process: the job
    exited 2 and was never requeued again."""
    import subprocess
    other = subprocess.Popen(["sleep", "60"])
    try:
        _left_by(tmp_path / "run", socket.gethostname(), pid=other.pid, job="100", restart=0)
        no_slurm.setenv("SLURM_JOB_ID", "100")
        no_slurm.setenv("SLURM_RESTART_COUNT", "1")
        with FolderLock(tmp_path / "run", "run"):
            assert json.loads((tmp_path / "run" / LOCK).read_text())["pid"] == os.getpid()
    finally:
        other.kill()
        other.wait()


def test_a_pid_reused_by_another_process_does_not_hold_the_lock(tmp_path, no_slurm):
    """The lock records its holder's start time: a live process with that PID started at another
    time is not the holder (the PID was reused after the holder died)."""
    import subprocess
    other = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / LOCK).write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(), "started": 1}))
        with FolderLock(tmp_path / "run", "run"):
            pass
        (tmp_path / "run").mkdir(exist_ok=True)
        _left_by(tmp_path / "run", socket.gethostname(), pid=other.pid)  # no start time (an older lock): its PID says
        with pytest.raises(MagmaError, match=f"PID {other.pid}"):
            FolderLock(tmp_path / "run", "run").__enter__()
    finally:
        other.kill()
        other.wait()
