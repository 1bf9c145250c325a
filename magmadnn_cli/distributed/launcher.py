"""`--processes N`: re-launch this command under the mpiexec of the running Python environment."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from ..errors import MagmaError
from .comm import launched_ranks, local_ranks

GUARD = "MAGMADNN_LAUNCHED"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def locate_mpi_launcher() -> str:
    """The mpiexec next to sys.executable (the PyPI `mpich` runtime installs it there), else PATH."""
    for name in ("mpiexec", "mpirun"):
        beside = Path(sys.executable).parent / name
        if beside.exists():
            return str(beside)
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name)
        if found:
            return found
    raise MagmaError("--processes needs mpiexec: `pip install mpich` into this environment (magmadnn's "
                     "default install does), or put an MPI's mpiexec on PATH")


def should_launch(processes: int) -> bool:
    return processes > 1 and not os.environ.get(GUARD) and launched_ranks() == 0


def limit_blas_threads(ranks: int, env: dict[str, str] | os._Environ = os.environ) -> None:
    """About cores / local ranks BLAS threads per rank, unless the user chose; before numpy loads."""
    if ranks > 1 and not any(v in env for v in THREAD_VARS):
        threads = str(max(1, (os.cpu_count() or 1) // ranks))
        for var in THREAD_VARS:
            env[var] = threads


def max_processes() -> int:
    """More ranks than this need --oversubscribe: 4 per core (at least 8)."""
    return max(8, 4 * (os.cpu_count() or 1))


def check_processes(processes: int, oversubscribe: bool, asked_by: str = "--processes") -> None:
    """`asked_by`: where the count came from, as the user wrote it (the flag, or the config's key)."""
    if processes > max_processes() and not oversubscribe:
        raise MagmaError(f"{asked_by} {processes}: this machine has {os.cpu_count()} cores, so more than "
                         f"{max_processes()} ranks would mostly wait for each other (and each holds its own copy of "
                         "the data); use fewer, or add --oversubscribe if you mean it")


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the launcher dies, even by SIGKILL (Linux)."""
    try:
        import ctypes  # noqa: PLC0415
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def launch(processes: int, argv: list[str]) -> int:
    """Run `magmadnn <argv>` on `processes` ranks; returns the job's exit code. SIGINT and SIGTERM
    sent to this launcher are passed on to mpiexec (which passes them to every rank, so they write a
    checkpoint and stop), and the launcher waits for the job to end: it never leaves ranks behind."""
    mpiexec = locate_mpi_launcher()
    flags: list[str] = []
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    env = dict(os.environ, **{GUARD: "1"})
    limit_blas_threads(processes, env)
    command = [mpiexec, *flags, "-n", str(processes), sys.executable, "-m", "magmadnn_cli", *argv]
    # its own session: a terminal's Ctrl-C reaches the job once, through `forward`, not twice
    job = subprocess.Popen(command, env=env, start_new_session=True,
                           preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    def forward(signum: int, frame: object) -> None:
        job.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return job.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def strip_processes(argv: list[str]) -> list[str]:
    """argv without `--processes N` / `--processes=N` (the child runs under mpiexec instead)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--processes":
            skip = True
        elif not arg.startswith("--processes="):
            out.append(arg)
    return out


def before_numpy() -> None:
    """Called first thing in the entry point: BLAS thread limits for ranks started by any launcher."""
    limit_blas_threads(local_ranks() if launched_ranks() > 1 else 1)
