"""`magmadnn env`: what this machine offers a run, as a cluster user asks it: the MPI library and the
launcher `--processes` would use, how many ranks it would start here or in the Slurm allocation, cores,
BLAS and its threads, GPUs and NCCL, and the shared memory the shared-memory strategy needs. Also the
srun steps whose tasks could not form one MPI job (`check_srun_step`)."""

from __future__ import annotations

import os
import platform
import re
import socket
import stat
import subprocess
import sys
from typing import Any, Mapping

from ..core import backend as B
from ..core import cpu_kernels
from ..errors import EveryRankError, MagmaError
from .comm import in_srun_step, launched_rank, launched_ranks
from .hosts import slurm_tasks
from .launcher import THREAD_VARS, locate_mpi_launcher, max_processes


LAUNCH_VARIABLES = ("PMI_RANK", "PMI_SIZE")


LAUNCHER_MARKS = ("PMI_PORT", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PALS_RANKID", "ALPS_APP_PE")


def launch_leftovers(env: Mapping[str, str] = os.environ, numbers_only: bool = False) -> str | None:
    """Why PMI_RANK / PMI_SIZE cannot be believed, or None: a value that is no whole number (a launcher
    writes one), or (unless `numbers_only`) a rank or count that no launcher stands behind (no PMI_FD
    socket of hydra's, no PMI_PORT, not an srun task, no Open MPI, PMIx or Cray PALS rank): left over
    in this shell from another job."""
    set_ = [k for k in LAUNCH_VARIABLES if k in env]
    unset = f"unset them: unset {' '.join(set_)}" if len(set_) > 1 else f"unset it: unset {set_[0]}" if set_ else ""
    bad = next((k for k in set_ if not env[k].strip().isdigit()), None)
    if bad is not None:
        return (f"{bad}={env[bad][:40]!r} is not a number, as an MPI launcher would set it: it is left over in this "
                f"shell or set by hand; {unset}")
    if numbers_only or not set_ or (int(env.get("PMI_SIZE", "1")) <= 1 and int(env.get("PMI_RANK", "0")) == 0):
        return None
    if _is_socket(env.get("PMI_FD", "")) or in_srun_step() or any(k in env for k in LAUNCHER_MARKS):
        return None
    said = ", ".join(f"{k}={env[k]}" for k in set_)
    return (f"{said} say an MPI launcher started this process as one of several ranks, but none did (no PMI_FD to "
            f"reach it): they are left over in this shell from another job; {unset}")


def _is_socket(fd: str) -> bool:
    """Whether `fd` names an open socket of this process (hydra's PMI_FD)."""
    try:
        return fd.isdigit() and stat.S_ISSOCK(os.fstat(int(fd)).st_mode)
    except OSError:
        return False


def describe() -> dict[str, Any]:
    """Every fact as a (JSON-ready) value; unknowns as None with the reason where there is one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        tasks: int | None = slurm_tasks()
    except MagmaError:  # said in the slurm facts
        tasks = None
    return {"host": socket.gethostname(), "python": sys.version.split()[0], "platform": platform.platform(),
            "cores": cores, **_mpi(), **_slurm(), **_blas(), **_gpus(), "dev_shm_free": _shm_free(),
            "ranks_to_fill_this_machine_or_allocation": tasks or cores,  # what --processes auto starts
            "processes_max_without_oversubscribe": tasks or max_processes()}


def _mpi() -> dict[str, Any]:
    try:
        launcher = locate_mpi_launcher()
    except MagmaError:
        launcher = None
    leftover = launch_leftovers()
    if leftover is not None:  # MPI_Init would abort on them, or wait for ranks that do not exist
        text = mpi_library_text_without_init()
        return {"mpi_library": first_line(text) if text else "unknown", "mpi_standard": None, "mpi_launcher": launcher,
                "mpi_transport": transport(text) if text else None, "launched_by": f"none: {leftover}",
                "launched_ranks": 0, "this_rank": 0}
    try:
        if launched_ranks() > 1:  # one rank of a job whose other ranks do not start MPI (env runs once):
            import mpi4py  # MPI_Init would wait for them; the version needs no init
            mpi4py.rc.initialize = mpi4py.rc.finalize = False
        from mpi4py import MPI  # initializes MPI: only when asked
        text = mpi_library_text()
        library, version, way = first_line(text), ".".join(map(str, MPI.Get_version())), transport(text)
    except Exception as exc:  # noqa: BLE001  not installed, or an MPI that fails to start
        library, version, way = f"unavailable ({type(exc).__name__}: {exc})", None, None
    return {"mpi_library": library, "mpi_standard": version, "mpi_launcher": launcher, "mpi_transport": way,
            "launched_by": _launched_by(), "launched_ranks": launched_ranks(), "this_rank": launched_rank()}


def _launched_by() -> str:
    """What started this process, as far as the launchers' variables say."""
    if launched_ranks():
        return "an srun step with an MPI plugin" if in_srun_step() else "mpiexec"
    if in_srun_step():
        tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "?")
        return (f"an srun step of {tasks} tasks with no MPI plugin: each task runs alone (srun --mpi=pmi2 joins "
                "them into one job)")
    return "none: not started by mpiexec or srun"


def mpi_library_text() -> str:
    """MPI_Get_library_version's text (importing mpi4py.MPI starts MPI unless mpi4py.rc says not)."""
    from mpi4py import MPI
    return MPI.Get_library_version().rstrip("\x00")


def check_srun_step() -> None:
    """Refuse an srun step whose tasks cannot form one MPI job (a `MagmaError` every task raises,
    said by task 0): started with no MPI plugin, each task would train alone into the same folder;
    started by `--mpi=pmix` for an MPICH built without PMIx, MPI_Init aborts with an internal error.
    Whether an MPICH has PMIx is read from its version text (its configure line names it: the PyPI
    wheel's does not); other MPI libraries are left to start."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "") if in_srun_step() else ""
    tasks = int(tasks) if tasks.isdigit() else 0
    if tasks < 2 or any(k in os.environ for k in ("PMI_FD", "PMI_RANK", "OMPI_COMM_WORLD_SIZE")):
        return
    fix = ("use `srun --mpi=pmi2` (`srun --mpi=list` shows this cluster's plugins), or start one task that "
           "launches the ranks itself: magmadnn ... --processes auto inside the allocation (docs/clusters.md)")
    if "PMIX_RANK" not in os.environ:
        raise EveryRankError(f"srun started {tasks} tasks with no MPI plugin (--mpi=none, or the cluster's "
                       f"MpiDefault): each would train alone, into the same run folder; {fix}")
    library = mpi_library_text_without_init()
    if library.startswith("MPICH") and "pmix" not in library.lower():
        raise EveryRankError(f"srun --mpi=pmix started this task, but the MPI that mpi4py loads ({first_line(library)}) "
                       f"was built without PMIx, so its MPI_Init would abort; {fix}")


def mpi_library_text_without_init() -> str:
    """MPI_Get_library_version's text, asked in a child process that does not start MPI (under a
    launcher this MPI cannot join, MPI_Init aborts the process); "" where it cannot be asked."""
    ask = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
           "print(MPI.Get_library_version().rstrip(chr(0)))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "SLURM_"))}
    try:
        return subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, env=env,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def first_line(library: str) -> str:
    """The library's first line, spaces collapsed ("MPICH Version: 5.0.2")."""
    return " ".join(library.strip().splitlines()[0].split()) if library.strip() else "unknown"


def transport(library: str, env: Mapping[str, str] = os.environ) -> str:
    """The transport MPI uses between hosts, as far as its version text and the environment say
    ("unknown" where they do not: the library decides at run time)."""
    extras = [f"{key}={env[key]}" for key in ("UCX_TLS", "FI_PROVIDER") if env.get(key)]
    if library.startswith("MPICH"):
        netmod, device = env.get("MPIR_CVAR_CH4_NETMOD"), re.search(r"^MPICH Device:\s*(.+)$", library, re.M)
        built = device.group(1).strip() if device else ""
        if netmod:
            way = f"{netmod} (MPIR_CVAR_CH4_NETMOD={netmod})"
        elif built.startswith("ch4:"):
            way = f"{built[4:].split()[0]} (MPICH's default: the first of its netmods {built})"
        else:
            way = f"{built} (MPICH's device)" if built else "unknown"
    elif "Open MPI" in library:
        pml = env.get("OMPI_MCA_pml")
        way = f"{pml} (OMPI_MCA_pml={pml})" if pml else "unknown (Open MPI chooses its PML at run time; OMPI_MCA_pml unset)"
    else:
        way = "unknown"
    return ", ".join([way, *extras])


def _slurm() -> dict[str, Any]:
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return {"slurm_job": None}
    try:
        tasks: int | str | None = slurm_tasks(env)
    except MagmaError as exc:  # a variable Slurm did not write: said, not expanded
        tasks = f"unknown: {exc}"
    nodes = env.get("SLURM_JOB_NODELIST")
    return {"slurm_job": env["SLURM_JOB_ID"], "slurm_nodes": nodes if nodes is None or len(nodes) <= 200 else
            nodes[:200] + "...", "slurm_tasks": tasks, "slurm_step": env.get("SLURM_STEP_ID")}


def _blas() -> dict[str, Any]:
    import numpy as np

    from ..core.blas import kernel_name  # numpy's BLAS, loaded with it
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        name = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError, TypeError):
        name = None
    kernels = cpu_kernels.describe(os.environ, kernel_name(), cpu_kernels.cpuinfo())
    return {"numpy": np.__version__, "blas": name, "blas_kernels": kernels,
            "blas_threads": {v: os.environ[v] for v in THREAD_VARS if v in os.environ}}  # none set: the library's default


def _gpus() -> dict[str, Any]:
    usable, why = B.probe_gpu()
    return {"gpu": why if usable else f"none: {why}", "nccl": B.nccl_module() is not None if usable else False}


def _shm_free() -> int | None:
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def launch_gate(ranked: bool, exempt: bool) -> tuple[str | None, bool]:
    """Before any MPI starts: why a command cannot run (PMI_RANK / PMI_SIZE left over in the shell: it
    would abort on a count that is no number, or run as a rank no launcher started; an `exempt` command
    (env, help) says it itself, and a `ranked` one, which uses every rank, leaves a stale count to MPI,
    which names it), and whether this process runs it (under a launch, a command that is not `ranked`
    runs once, on rank 0)."""
    from .comm import launched_rank, launched_ranks
    leftover = launch_leftovers(numbers_only=ranked)
    if leftover is not None:
        return (None, True) if exempt else (leftover, False)
    return None, ranked or launched_ranks() <= 1 or launched_rank() == 0
