"""The communicator interface: rank, size, bcast, allreduce, allgather, point to point, barrier, abort.

`SingleProcess` makes every collective a no-op, so the loop has no `if distributed` branches.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import socket
import stat
import sys
import termios
import time
from typing import Any, Callable

from ..errors import MagmaError


class Communicator:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def bcast_array(self, array: Any, root: int = 0) -> None:
        """Overwrite `array` in place with root's copy."""

    def allreduce_sum(self, array: Any) -> None:
        """Sum `array` (a flat float buffer) over all ranks, in place."""

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def allgather_array(self, local: Any, counts: list[int]) -> Any:
        """Every rank's flat `local` (rank r gives counts[r] elements), concatenated in rank order."""
        return local.ravel().copy()

    def split(self, color: int, key: int) -> "Communicator":
        """The ranks that give the same `color`, ordered by `key` (MPI_Comm_split)."""
        return self

    # -- point to point (the search's master and workers) ---------------------------------------
    # A single process has no peer: calling these on it is a programming error, not a missing feature.
    def send(self, obj: Any, dest: int) -> None:
        raise RuntimeError("one process has no other rank to send to")

    def recv(self, source: int = 0) -> Any:
        raise RuntimeError("one process has no other rank to receive from")

    def recv_any(self) -> tuple[int, Any]:
        """The next message from any rank, with its sender."""
        raise RuntimeError("one process has no other rank to receive from")

    def send_array(self, array: Any, dest: int) -> None:
        """A flat float array to `dest` (no pickling), which takes it with `recv_array`."""
        raise RuntimeError("one process has no other rank to send to")

    def recv_array(self, out: Any, source: int) -> None:
        """Fill `out` (contiguous, of the sent size and type) with the array `source` sent."""
        raise RuntimeError("one process has no other rank to receive from")

    def barrier(self) -> None:
        pass

    def placement(self) -> dict[str, Any]:
        """How the job runs: MPI library, transport, ranks per host (nothing for one process)."""
        return {}

    def reducer(self) -> str:
        """How `allreduce_sum` sums over ranks (the reduction used, e.g. "ring", "allreduce (NCCL)")."""
        return "none (one process)"

    def reduces_on_device(self) -> bool:
        """Whether a device array is summed without leaving the device (one process, or NCCL): what a
        captured step needs."""
        return True

    def waiting(self, what: str) -> contextlib.AbstractContextManager:
        """Around a wait for the other ranks (a step's reduction): the watchdog times the outermost."""
        return contextlib.nullcontext()

    def watched(self, timeout: float | None,
                resume_note: Callable[[], str | None]) -> contextlib.AbstractContextManager:
        """While the block runs, a wait longer than `timeout` s (None or 0: none), or a stop signal during a
        wait that a rank no longer answers, ends the job naming that rank, then `resume_note()` (how to go on)
        (distributed/watchdog.py); every rank enters it together."""
        return contextlib.nullcontext()

    def abort(self, code: int = 1) -> None:
        sys.exit(code)


class SingleProcess(Communicator):
    """One process: every collective is the identity."""


class _Joined:
    """This process's communicator, once made: a process joins MPI once, and an error report ends the
    job through it (`abort_if_distributed`). Per process, as MPI's world is."""

    def __init__(self) -> None:
        self.communicator: Communicator | None = None

    def get(self, make: Callable[[], Communicator]) -> Communicator:
        if self.communicator is None:
            self.communicator = make()
        return self.communicator


_JOINED = _Joined()


def joined(make: Callable[[], Communicator]) -> Communicator:
    """This process's communicator: `make()`'s the first time, the same one after."""
    return _JOINED.get(make)


def has_joined() -> bool:
    """Whether this process has made its communicator (under a launcher: joined MPI)."""
    return _JOINED.communicator is not None


def _env_int(*keys: str) -> int | None:
    for key in keys:
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return None


def in_srun_step() -> bool:
    """Whether this process is a task of an `srun` step (not a batch script's or salloc's shell)."""
    return "SLURM_STEP_ID" in os.environ


def _slurm_step() -> bool:
    """A task of an `srun` step that speaks to MPI through a PMI plugin (--mpi=pmi2 sets PMI_FD,
    --mpi=pmix PMIX_RANK and may set no size): its size and rank come from Slurm's variables."""
    return in_srun_step() and any(k in os.environ for k in ("PMI_FD", "PMIX_RANK", "PMI_RANK"))


def launched_ranks() -> int:
    """How many ranks the launcher says it started (0 when not under a launcher): mpiexec (hydra,
    Open MPI, PMIx) or `srun --mpi=pmi2|pmix` inside a Slurm allocation."""
    return _env_int(*_size_variables()) or 0


def _size_variables() -> tuple[str, ...]:
    """Where a launcher says the rank count, in the order believed (an srun step's own after MPI's)."""
    return ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE") + (
        ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if _slurm_step() else ())


def size_variable() -> str:
    """The variable that `launched_ranks` read, with its value ('PMI_SIZE=2')."""
    key = next((k for k in _size_variables() if os.environ.get(k, "").isdigit()), "PMI_SIZE")
    return f"{key}={os.environ.get(key, '')}"


def launched_rank() -> int:
    """This process's rank as its launcher says (a task of any srun step: its SLURM_PROCID); 0 alone."""
    found = _env_int("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
    if found is None and in_srun_step():
        found = _env_int("SLURM_PROCID")
    return found or 0


def local_ranks() -> int:
    """Ranks on this node, as the launcher says (the communicator learns it exactly from MPI)."""
    slurm = _env_int("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE") if _slurm_step() else None
    return _env_int("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE") or slurm or launched_ranks() or 1


def abort_if_distributed(code: int) -> None:
    """After a rank has reported its error: end every rank (the others may wait in a collective)."""
    if _JOINED.communicator is not None and _JOINED.communicator.size > 1:
        _JOINED.communicator.abort(code)


def wait_until_read(stream: Any, limit: float = 10.0) -> None:
    """Wait (at most `limit` s) until the launcher has read what this rank wrote to `stream`, when it
    is a pipe: an MPI abort kills the job at once, and the launcher drops output still in the pipe."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        unread = array.array("i", [0])
        deadline = time.monotonic() + limit
        while fcntl.ioctl(fd, termios.FIONREAD, unread) == 0 and unread[0] and time.monotonic() < deadline:
            time.sleep(0.002)
    except (OSError, ValueError, AttributeError):  # no file descriptor, or no FIONREAD for it
        return


def shared_memory_fits(nbytes: int, folder: str = "/dev/shm") -> bool:
    """Whether the shared-memory filesystem (where MPI places shared windows) has room, with a
    margin; True where there is none to ask (MPI then uses what it has)."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return True
    return stats.f_bavail * stats.f_frsize >= 1.1 * nbytes


def on_root(comm: Any, make: Callable[[], Any]) -> Any:
    """Run `make()` on rank 0 only and give every rank its result, or raise its error on every rank
    (so no rank waits for one that failed)."""
    value, error = None, None
    if comm.is_root:
        try:
            value = make()
        except MagmaError as exc:
            error = str(exc)
    error = comm.bcast(error)
    if error is not None:
        _raise_together(MagmaError(error))
    return comm.bcast(value)


def on_every_rank(comm: Any, make: Callable[[], Any]) -> Any:
    """Run `make()` on every rank (local work: no collectives inside). A MagmaError on any rank is
    raised on every rank together, the lowest failing rank's, so it is said once and no rank waits
    for, or aborts, the others (every rank reads the same data and finds the same mistake)."""
    if comm.size == 1:
        return make()
    value, error = None, None
    try:
        value = make()
    except MagmaError as exc:
        error = exc
    found = comm.allgather(None if error is None else (str(error), error.exit_code, socket.gethostname()))
    failed = [(rank, e) for rank, e in enumerate(found) if e]
    if not failed:
        return value
    rank, (message, code, host) = failed[0]
    if len(failed) < comm.size:  # not every rank's mistake (a file missing on one node): say whose
        message = f"rank {rank} on {host}: {message}"
    _raise_together(MagmaError(message), code)  # every rank raises the lowest failing rank's; rank 0 prints it


def _raise_together(failure: MagmaError, exit_code: int = MagmaError.exit_code) -> None:
    """Raise `failure` as one that every rank raises at this point (no MPI abort needed)."""
    failure.exit_code, failure.collective = exit_code, True
    raise failure
