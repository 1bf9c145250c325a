"""A rank killed by SIGKILL (the out-of-memory killer, a scheduler, kill -9) ends the whole job under
hydra, which prints only its own banner. The launcher of `--processes N` then says what happened,
names the newest checkpoint and the command that continues the run, and removes the shared-memory
segments the killed ranks could not (each leaked 2 MB of /dev/shm, which is RAM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import find_mpiexec, job_processes, project, still_running, wait_until_gone

SHM = Path("/dev/shm")


def _segments() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith("mpich_shm_")} if SHM.is_dir() else set()


def _checkpointing_job(tmp_path, *sets: str) -> tuple[subprocess.Popen, set[int], list[int]]:
    """`train --processes 2` into tmp_path/run, checkpointing every step: the launcher, every process
    of the job, and its ranks, once the first checkpoint is on disk."""
    config, out = project(tmp_path), tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    sets = ("training.epochs=5000", "training.checkpoint.every_steps=1", *sets)
    job = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(out), "-q",
                            "--processes", "2", *[a for s in sets for a in ("--set", s)]],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while job.poll() is None and not list((out / "checkpoints").glob("step*.npz")):
        assert time.monotonic() < deadline, "no checkpoint in 120 s"
        time.sleep(0.02)
    assert job.poll() is None, job.communicate()
    processes = job_processes(job.pid)
    ranks = sorted(pid for pid in processes - {job.pid} if b"magmadnn_cli" in Path(f"/proc/{pid}/cmdline").read_bytes())
    return job, processes, ranks


@pytest.mark.mpi
@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec in this environment")
def test_a_killed_rank_is_said_with_the_resume_command_and_leaves_no_shared_memory(tmp_path):
    out, before = tmp_path / "run", _segments()
    job, processes, ranks = _checkpointing_job(tmp_path)
    os.kill(ranks[-1], signal.SIGKILL)
    _, err = job.communicate(timeout=60)
    said = " ".join(err.split())
    assert job.returncode == 137, err
    assert "a rank was killed (SIGKILL" in said and "the newest checkpoint: " in said, said
    assert f"--resume {out}" in said and "--processes 2" in said, said
    assert not wait_until_gone(processes), "a process of the job outlived it"
    assert not _segments() - before, "shared-memory segments of the job were left in /dev/shm"


@pytest.mark.mpi
@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec in this environment")
def test_a_job_that_outlives_a_second_sigterm_is_killed_saying_how_to_go_on(tmp_path):
    """Ranks that cannot act on a signal (stopped here; inside MPI_Init in the field, before any
    watchdog runs) outlived any number of SIGTERMs to the launcher: the job hung. FORCE_AFTER s
    after the second one, every process of the job is killed, and the launcher says how to go on."""
    from magmadnn_cli.distributed.launcher import FORCE_AFTER
    out = tmp_path / "run"
    job, processes, ranks = _checkpointing_job(tmp_path, "distributed.timeout=0")
    try:
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + FORCE_AFTER + 60
        while still_running(set(ranks)):  # SIGTERMs, as a scheduler or a person sends them (two at once merge)
            assert time.monotonic() < deadline, "the job outlived its SIGTERMs"
            job.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        _, err = job.communicate(timeout=60)  # the launcher says how to go on once the ranks are gone
    finally:  # a failure leaves no stopped rank behind
        for pid in still_running(processes) if job.poll() is None else ():
            os.kill(pid, signal.SIGKILL)
    said = " ".join(err.split())
    assert job.returncode == 128 + signal.SIGTERM, err
    assert f"went on {FORCE_AFTER:g} s after a second SIGTERM" in said and "every process of it was killed" in said, said
    assert f"--resume {out}" in said and "--processes 2" in said, said
    assert not wait_until_gone(processes), "a process of the job outlived it"
