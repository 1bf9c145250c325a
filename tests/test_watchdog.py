"""The collective timeout (`distributed.timeout`): a rank that stops answering (SIGSTOPped, frozen, cut
off by the network) ends the job within the timeout instead of hanging it forever; the message names
that rank and its host and the last checkpoint, the job exits non-zero, and no process is left. A
SIGTERM that comes while the ranks wait in such a collective ends the job too (Python's handlers cannot
run while the main thread is inside MPI)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, find_mpiexec, job_processes, project, wait_until_gone

MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")

# The CLI, with rank 1 stopping itself (SIGSTOP) just before step 12's reduction, once it has written its
# PID, and rank 0 saying (a file) that it enters that reduction: the test waits on these, never on a clock.
STOPPER = """\
import os, signal, sys, time
from pathlib import Path
from magmadnn_cli import cli
from magmadnn_cli.distributed.data_parallel import DataParallel
marks, reduce, start_step, calls = Path(os.environ["MARKS"]), DataParallel.reduce, DataParallel.start_step, [0]
late = lambda self: str(self.comm.rank) == os.environ.get("LATE_RANK")
def mark(self):
    (marks / f"rank{self.comm.rank}.tmp").write_text(str(os.getpid()))
    (marks / f"rank{self.comm.rank}.tmp").rename(marks / f"rank{self.comm.rank}")
def stopping_reduce(self, *args):
    calls[0] += 1
    if calls[0] == 12:
        mark(self)
        if self.comm.rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
    return reduce(self, *args)
def late_start(self, passes):  # LATE_RANK: busy outside MPI from step 12 on (until the job ends)
    if late(self) and calls[0] == 11:
        mark(self)
        time.sleep(120)
    return start_step(self, passes)
DataParallel.reduce, DataParallel.start_step = stopping_reduce, late_start
sys.argv[0] = "magmadnn"
cli.main()
"""

def _start(tmp_path, *sets: str, ranks: int = 2, late_rank: int | None = None, script: str = STOPPER,
           defaults: tuple[str, ...] = ("training.epochs=1000", "training.checkpoint.every_steps=5",
                                        "training.checkpoint.every_epochs=null")) -> tuple[subprocess.Popen, set[int]]:
    """A 2-rank training under `script` (default: checkpoints every 5 steps, rank 1 stops before step
    12's reduction); returns the job and its processes once ranks 0 and 1 have marked their place."""
    config = project(tmp_path)
    (tmp_path / "stopper.py").write_text(script)
    (tmp_path / "marks").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT), MARKS=str(tmp_path / "marks"),
               LATE_RANK=str(late_rank))
    sets = (*defaults, "distributed.strategy=allreduce", *sets)
    job = subprocess.Popen([str(MPIEXEC), "-n", str(ranks), sys.executable, str(tmp_path / "stopper.py"), "train",
                            str(config), "--out", str(tmp_path / "run"), "-q", *[a for s in sets for a in ("--set", s)]],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not all((tmp_path / "marks" / f"rank{r}").exists() for r in (0, 1)):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "the ranks never reached their marks"
        time.sleep(0.02)
    return job, job_processes(job.pid)


def _ended(job: subprocess.Popen, processes: set[int], within: float) -> str:
    """The job's stderr, once it has ended within `within` s with no process left (stopped ones included)."""
    started = time.monotonic()
    try:
        _, err = job.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        for pid in processes:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the job still ran {within} s after its rank stopped: {job.communicate()[1]}")
    assert not wait_until_gone(processes, 5), "processes of the job were left running"
    assert job.returncode != 0, err
    assert time.monotonic() - started < within
    return err


def test_a_stopped_rank_ends_the_job_after_the_timeout_naming_it(tmp_path):
    from magmadnn_cli.distributed.leftovers import segments
    before = segments()
    job, processes = _start(tmp_path, "distributed.timeout=3")
    err = _ended(job, processes, within=15)
    assert not segments() - before, "the aborted job left shared memory in /dev/shm"  # 2 MB of RAM a job
    assert f"rank 1 on {socket.gethostname()}" in err and "stopped answering" in err, err
    assert "distributed.timeout (3 s)" in err, err
    assert f"last checkpoint: {tmp_path / 'run' / 'checkpoints' / 'step00000010.npz'}" in err, err
    assert f"Continue with: magmadnn train {tmp_path / 'c.yaml'} -q " in err and f"--resume {tmp_path / 'run'}" in err, err


def test_sigterm_while_a_collective_is_stuck_ends_the_job(tmp_path):
    job, processes = _start(tmp_path)  # the default timeout (minutes): only the signal can end it in time
    job.send_signal(signal.SIGTERM)
    err = _ended(job, processes, within=15)
    assert "SIGTERM" in err and f"rank 1 on {socket.gethostname()}" in err, err
    assert "step00000010.npz" in err, err


@pytest.mark.parametrize("value, ok", [("0", True), ("null", True), ("30", True), ("-1", False)])
def test_the_timeout_is_seconds_and_0_or_null_turns_it_off(tmp_path, value, ok):
    from magmadnn_cli.config.loading import load_config
    from magmadnn_cli.errors import MagmaError
    config = project(tmp_path)
    if ok:
        assert load_config(config, [f"distributed.timeout={value}"]).distributed.timeout in (0, None, 30)
        assert load_config(config).distributed.timeout == 600
    else:
        with pytest.raises(MagmaError, match="distributed.timeout"):
            load_config(config, [f"distributed.timeout={value}"])


def test_the_job_is_ended_with_its_message_when_the_rank_that_should_say_it_is_late(tmp_path):
    """Rank 1 stops; rank 0, which would speak (the lowest rank that answers), is busy outside MPI and
    never times out: rank 2 times out, waits for it, and then says it and ends the job (it once ended
    the job with exit 1 and no word, seen under load when rank 0 was writing a checkpoint)."""
    job, processes = _start(tmp_path, "distributed.timeout=3", ranks=3, late_rank=0)
    err = _ended(job, processes, within=30)
    assert "the job is ended" in err and f"rank 1 on {socket.gethostname()}" in err and "stopped answering" in err, err


# The CLI, with rank 1 stopping itself as the final metrics begin (their evaluation sums over ranks).
FINAL_STOPPER = """\
import os, signal, sys
from pathlib import Path
from magmadnn_cli import cli
from magmadnn_cli.commands import train
marks, final_metrics = Path(os.environ["MARKS"]), train.final_metrics
def stopping(run, *args):
    rank = run.comm.rank
    (marks / f"rank{rank}.tmp").write_text(str(os.getpid()))
    (marks / f"rank{rank}.tmp").rename(marks / f"rank{rank}")
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    return final_metrics(run, *args)
train.final_metrics = stopping
sys.argv[0] = "magmadnn"
cli.main()
"""


def test_a_rank_stopped_in_the_final_evaluation_ends_the_job_too(tmp_path):
    """The timeout watched the training loop only: a rank stopped as the final metrics began hung the
    job forever (rank 0 in the evaluation's reduction), and SIGTERMs could not end it."""
    job, processes = _start(tmp_path, "distributed.timeout=3", script=FINAL_STOPPER, defaults=("training.epochs=2",))
    err = _ended(job, processes, within=15)
    assert f"rank 1 on {socket.gethostname()}" in err and "stopped answering" in err, err
    assert not (tmp_path / "run" / "model.npz").exists()
