"""MPI data parallelism through mpi4py: gradient reduction strategies, weight broadcast, and an
abort that ends the whole job when any rank fails (no hung collectives)."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import time
from collections import Counter
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..core import backend as B
from ..errors import MagmaError
from .comm import Communicator, launched_ranks, size_variable, wait_until_read
from .environment import first_line, mpi_library_text, transport
from .launcher import share_node_cores
from .leftovers import unlink_own_segments
from .nccl import NcclReducer, load_nccl
from .watchdog import Waits, watching

OBJECT, ARRAY = 1, 2  # point-to-point tags: pickled objects, raw arrays
MAX_PAUSE = 5e-4  # seconds between polls of a receive that has waited long


class MPICommunicator(Communicator):
    """`reduction`: allreduce (MPI's own, or NCCL's for GPU buffers), ring (reduce-scatter +
    allgather by point-to-point, as in MagmaDNN's papers) or parameter_server (rank 0 sums and
    broadcasts); the last two stage GPU buffers through host memory."""

    def __init__(self, reduction: str = "allreduce", part_of: "MPICommunicator | None" = None,
                 comm: Any = None) -> None:
        """The world (checked against the launcher, with an abort hook), or `comm`, a part of
        `part_of` (see `split`)."""
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.parent = part_of
        self.reduction = reduction
        self._reduce, on_device = {"allreduce": (self._allreduce, True), "ring": (self._ring, False),
                                   "parameter_server": (self._parameter_server, False)}[reduction]
        self._nccl: NcclReducer | bool | None = None if on_device and part_of is None else False  # lazy; False: none
        self.owned: list[Any] = []  # MPI objects this communicator made (split parts, windows): freed by `release`
        if part_of is not None:
            self.local_rank, self.local_size = part_of.local_rank, part_of.local_size
            self.waits = part_of.waits
            return
        self.waits = Waits()  # what this rank waits for inside MPI now (the watchdog reads it)
        self.unanswered: list[Any] = []  # the watchdog's answers to a rank that no longer asked: MPI may still read them
        expected = launched_ranks()
        if self.size == 1 and expected > 1:
            said = size_variable()
            raise MagmaError(
                f"{said} says a launcher started {expected} processes, but MPI sees only 1: the mpiexec used belongs "
                f"to a different MPI than the one mpi4py loaded ({first_line(MPI.Get_library_version())}), or "
                f"{said.split('=')[0]} is left over in this shell from another job (unset it). Use the mpiexec of "
                "that MPI, or `magmadnn train --processes N`, which picks the environment's own.")
        self.hosts: list[str] = self.comm.allgather(socket.gethostname())  # by rank: messages, the run's record
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        share_node_cores(local)
        local.Free()
        install_abort_hook(self)
        atexit.register(self.release)  # before mpi4py's MPI_Finalize (atexit runs in reverse order)

    def release(self) -> None:
        """Free every MPI object this communicator made, newest first (windows before the communicators
        they live on), so MPI_Finalize finds none: some transports (MPICH over OFI) fail the job
        otherwise. Collective: every rank calls it at exit."""
        while self.owned:
            handle = self.owned.pop()
            if handle not in (MPI.COMM_NULL, MPI.WIN_NULL):
                handle.Free()

    def placement(self) -> dict[str, Any]:
        """The MPI library (its first line), its transport, and how many ranks run on each host."""
        root, text = self._root(), mpi_library_text()
        hosts, way = dict(Counter(root.hosts)), transport(text)
        if len(hosts) == 1 and os.environ.get("MPIR_CVAR_NOLOCAL", "0") in ("0", ""):  # a host's ranks share memory
            way = f"shared memory (every rank on one host; between hosts: {way})"
        return {"mpi_library": first_line(text), "mpi_transport": way, "ranks_per_host": hosts}

    def reducer(self) -> str:
        nccl = isinstance(self._nccl, NcclReducer)
        return self.reduction + " (NCCL)" * nccl

    def reduces_on_device(self) -> bool:
        """NCCL (made by the first collective on a device array); MPI stages through the host."""
        return isinstance(self._nccl, NcclReducer)

    def watched(self, timeout: float | None, resume_note: Callable[[], str | None]) -> Any:
        """The world's watchdog (a part's ranks alone cannot start it: it is collective over the world)."""
        return watching(self, timeout, resume_note) if self.parent is None else contextlib.nullcontext()

    def waiting(self, what: str) -> Any:
        return self.waits.on(what)

    # -- collectives (each a wait the watchdog times) --------------------------------------------
    def bcast(self, obj: Any, root: int = 0) -> Any:
        with self.waits.on("a broadcast"):
            return self.comm.bcast(obj, root=root)

    def _device_reducer(self, array: Any) -> NcclReducer | None:
        """NCCL for a GPU array under the allreduce reduction, made on first use (None: use MPI)."""
        if isinstance(array, np.ndarray) or self._nccl is False:
            return None
        if self._nccl is None:  # NCCL needs a GPU of its own per rank on a node
            nccl = load_nccl() if B.current().xp.cuda.runtime.getDeviceCount() >= self.local_size else None
            self._nccl = NcclReducer(nccl, self.rank, self.size, self.comm.bcast) if nccl is not None else False
        return self._nccl or None

    def bcast_array(self, array: Any, root: int = 0) -> None:
        if (nccl := self._device_reducer(array)) is not None:
            nccl.bcast(array, root)
            return
        host = B.to_host(array)
        with self.waits.on("a broadcast"):
            self.comm.Bcast(host, root=root)
        if host is not array:
            array[...] = B.to_device(host)

    def allreduce_sum(self, array: Any) -> None:
        if (nccl := self._device_reducer(array)) is not None:
            nccl.allreduce_sum(array)
            return
        host = B.to_host(array)  # without NCCL, cupy buffers are staged through the host
        if not host.flags.c_contiguous:
            raise ValueError("allreduce_sum needs a contiguous buffer")
        with self.waits.on(f"a {self.reduction} reduction"):
            self._reduce(host)
        if host is not array:
            array[...] = B.to_device(host)

    def allgather(self, obj: Any) -> list[Any]:
        with self.waits.on("an allgather"):
            return self.comm.allgather(obj)

    def allgather_array(self, local: Any, counts: list[int]) -> Any:
        """MPI_Allgatherv of flat float arrays (GPU arrays staged through the host)."""
        host = np.ascontiguousarray(B.to_host(local)).ravel()
        gathered = np.empty(sum(counts), dtype=host.dtype)
        with self.waits.on("an allgather"):
            self.comm.Allgatherv(host, [gathered, counts])
        return gathered if isinstance(local, np.ndarray) else B.to_device(gathered)

    def split(self, color: int, key: int) -> "MPICommunicator":
        """The ranks with this `color` (ordered by `key`), reducing the same way through
        MPI (NCCL's communicator spans the world only); aborting it ends the whole job."""
        part = self.comm.Split(color, key)
        self._root().owned.append(part)
        return MPICommunicator(self.reduction, part_of=self, comm=part)

    def _root(self) -> "MPICommunicator":
        """The world communicator this one is a part of (itself for the world): it frees the parts."""
        return self.parent._root() if self.parent is not None else self

    # Point to point: a waiting rank polls with growing pauses instead of spinning in MPI's blocking
    # receive, so a master or parameter server that mostly waits leaves its core to the workers.
    def send(self, obj: Any, dest: int) -> None:
        self.comm.send(obj, dest=dest, tag=OBJECT)

    def recv(self, source: int = 0) -> Any:
        self._await(source, OBJECT)
        return self.comm.recv(source=source, tag=OBJECT)

    def recv_any(self) -> tuple[int, Any]:
        source = self._await(MPI.ANY_SOURCE, OBJECT).Get_source()
        return source, self.comm.recv(source=source, tag=OBJECT)

    def send_array(self, array: Any, dest: int) -> None:
        self.comm.Send(np.ascontiguousarray(B.to_host(array)), dest=dest, tag=ARRAY)

    def recv_array(self, out: Any, source: int) -> None:
        host = out if isinstance(out, np.ndarray) else np.empty(out.shape, out.dtype)
        self._await(source, ARRAY)
        self.comm.Recv(host, source=source, tag=ARRAY)
        if host is not out:
            out[...] = B.to_device(host)

    def _await(self, source: int, tag: int) -> Any:
        """Until a message from `source` with `tag` has arrived; its status."""
        status, pause = MPI.Status(), 0.0
        with self.waits.on("a message from " + (f"rank {source}" if source >= 0 else "any rank")):
            while not self.comm.Iprobe(source=source, tag=tag, status=status):
                time.sleep(pause)
                pause = min(MAX_PAUSE, 2 * pause or 1e-5)
        return status

    def barrier(self) -> None:
        with self.waits.on("a barrier"):
            self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        if self.parent is not None:
            self.parent.abort(code)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            wait_until_read(stream)
        unlink_own_segments()  # MPI_Abort skips MPI_Finalize, which would unlink them
        self.comm.Abort(code)

    # -- reduction strategies (each sums `buf` over ranks, in place, identically on every rank) --
    def _allreduce(self, buf: np.ndarray) -> None:
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def _parameter_server(self, buf: np.ndarray) -> None:
        if self.rank == 0:
            self.comm.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)
        else:
            self.comm.Reduce(buf, None, op=MPI.SUM, root=0)
        self.comm.Bcast(buf, root=0)

    def _ring(self, buf: np.ndarray) -> None:
        """Ring allreduce: N-1 reduce-scatter steps then N-1 allgather steps; each rank sends
        2(N-1)/N of the buffer in all."""
        n, r = self.size, self.rank
        bounds = np.linspace(0, buf.size, n + 1).astype(int)
        chunk = [buf[bounds[i]:bounds[i + 1]] for i in range(n)]
        right, left = (r + 1) % n, (r - 1) % n
        scratch = np.empty(max(len(c) for c in chunk), dtype=buf.dtype)
        for step in range(n - 1):  # after this, rank r holds the full sum of chunk (r + 1) % n
            send, recv = chunk[(r - step) % n], chunk[(r - step - 1) % n]
            self.comm.Sendrecv(send, dest=right, recvbuf=scratch[:len(recv)], source=left)
            recv += scratch[:len(recv)]
        for step in range(n - 1):
            send, recv = chunk[(r - step + 1) % n], chunk[(r - step) % n]
            self.comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)


def install_abort_hook(comm: MPICommunicator) -> None:
    """An uncaught exception on any rank prints that rank's message and aborts every rank, since a
    console entry point bypasses `python -m mpi4py`."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        comm.abort(1)

    sys.excepthook = hook
