"""The `shared_memory` strategy: ranks on one node keep ONE copy of the weights and of the optimizer
state in MPI shared memory, and split both the gradient reduction and the update between them.

Each rank's backward pass writes its gradients (and the step's loss/accuracy/stop slots) into its
own row of a shared array. A reduction is then: every node-local rank sums its share of the rows
(always in the same order, so results are deterministic), the sums of each share are allreduced
across nodes among the ranks holding the same share, and after the reduction every rank updates
only its share of the shared weights; every rank sums the statistics slots itself. Dense layers
whose rows are no larger than their weights skip the sum: the ranks publish their rows, and each
computes its share of the weight gradient from all of them (`row_exchange`). Within a node no
gradient travels through MPI buffers and the optimizer's work is divided N ways; the weights need
no broadcast afterwards, being shared.
CPU only: on a GPU it falls back to MPI's allreduce (`DataParallel`). Strategy `auto` (the default) uses it when
all ranks share one node and MPI's allreduce otherwise; `shared_memory` uses it across nodes too.
MAGMADNN_RANKS_PER_NODE=N makes every N consecutive ranks a "node", to run the multi-node path on
one machine (the tests do).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, TypeVar

import numpy as np
from mpi4py import MPI

from ..core import backend as B
from ..errors import MagmaError
from .comm import on_every_rank, shared_memory_fits
from .data_parallel import STATS, DataParallel
from .mpi import MPICommunicator
from .row_exchange import RowExchange


def node_split(comm: Any) -> Any:
    """The ranks of `comm` (an mpi4py communicator) on this rank's node, in rank order; with
    MAGMADNN_RANKS_PER_NODE=N every N consecutive ranks (to test the multi-node path on one machine)."""
    fake = os.environ.get("MAGMADNN_RANKS_PER_NODE", "")
    if fake.isdigit() and int(fake) > 0:
        return comm.Split(comm.Get_rank() // int(fake), comm.Get_rank())
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


class SharedMemoryCommunicator(MPICommunicator):
    """MPI plus the node topology the sharded strategy needs: `local` (the ranks of this node) and
    `cross` (the ranks holding the same share on every node)."""

    def __init__(self, across_nodes: bool = True) -> None:
        super().__init__("allreduce")
        self.across_nodes = across_nodes
        self.local = node_split(self.comm)
        self.local_rank, self.local_size = self.local.Get_rank(), self.local.Get_size()
        per_node = self.comm.allgather(self.local.Get_size())
        if len(set(per_node)) != 1 and across_nodes:
            raise MagmaError("distributed.strategy shared_memory needs the same number of ranks on every node "
                             f"(found {sorted(set(per_node))}); use allreduce")
        self.cross = self.comm.Split(self.local_rank, self.rank)  # the same share on every node
        self.owned += [self.local, self.cross]  # freed at exit (`release`), after the windows on them

    def allocate_shared(self, count: int, dtype: np.dtype) -> np.ndarray:
        """`count` elements in memory shared by this node's ranks (allocated by its rank 0)."""
        return self.allocate_shared_window(count, dtype)[0]

    def allocate_shared_window(self, count: int, dtype: np.dtype) -> tuple[np.ndarray, Any]:
        """`allocate_shared`, and the window that holds the memory (for `free_shared`)."""
        window = MPI.Win.Allocate_shared(count * dtype.itemsize if self.local_rank == 0 else 0, dtype.itemsize,
                                         comm=self.local)
        self.owned.append(window)  # the memory lives as long as its window: freed at exit, before MPI_Finalize
        return np.ndarray((count,), dtype=dtype, buffer=window.Shared_query(0)[0]), window

    def free_shared(self, window: Any) -> None:
        """Free a window before exit (collective over the node's ranks); its arrays must be unused."""
        self.owned.remove(window)
        window.Free()

    def all_agree(self, flag: bool) -> bool:
        return bool(self.comm.allreduce(flag, op=MPI.LAND))

    def node_agrees(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank of this node."""
        return bool(self.local.allreduce(flag, op=MPI.LAND))


def shared_memory_refusal(network: Any, optimizer: Any, comm: SharedMemoryCommunicator) -> str | None:
    """Why the shared_memory strategy cannot run here (None: it can): CPU only, ranks on one node unless
    asked across nodes, and room in /dev/shm on every rank."""
    if B.current().device != "cpu":
        return "the shared_memory strategy runs on the CPU; a GPU reduces through MPI's allreduce (or NCCL)"
    if comm.local_size < comm.size and not comm.across_nodes:
        return "the ranks span several nodes; MPI's allreduce carries the gradients between them"
    nbytes = _shared_floats(network, optimizer, comm.local_size) * network.flat_params.dtype.itemsize
    if comm.all_agree(shared_memory_fits(nbytes)):
        return None
    return (f"/dev/shm has less than the {nbytes / 2**20:.0f} MiB the shared_memory strategy needs (a container's "
            "default is 64 MiB: docker run --shm-size); using MPI allreduce instead")


def _shared_floats(network: Any, optimizer: Any, ranks: int) -> int:
    size = network.flat_params.size
    return size * (1 + len(optimizer.slots)) + ranks * (size + STATS)


class ShardedDataParallel(DataParallel):
    """One copy of the weights and optimizer slots per node; each rank's gradients and statistics
    in its own row; rank r reduces and updates share r of the buffers."""

    captures = False
    whole_gradient = False

    comm: SharedMemoryCommunicator

    def strategy_used(self) -> str:
        return "shared_memory"

    def summary(self) -> dict[str, Any]:
        """Per dense layer, the steps whose weight gradient each rank computed from the node's rows."""
        return {"dense_gradients_from_node_rows": self.exchange.summary()} if self.exchange is not None else {}

    def _place(self) -> None:
        comm, net, opt = self.comm, self.net, self.optimizer
        n, r = comm.local_size, comm.local_rank
        size, slots, dtype = net.flat_params.size, tuple(opt.slots), net.flat_params.dtype
        memory = comm.allocate_shared(_shared_floats(net, opt, n), dtype)
        params = memory[:size]
        state = memory[size:size * (1 + len(slots))].reshape(len(slots), size)
        self.rows = memory[size * (1 + len(slots)):].reshape(n, size + STATS)
        if r == 0:  # this node's copy: rank 0's weights, then fresh optimizer state
            params[...] = net.flat_params
            comm.cross.Bcast(params, root=0)
            state.fill(0)
        comm.local.Barrier()
        self.buffer = self.rows[r]
        net.place(params, self.buffer[:size])
        opt.state = {name: state[i] for i, name in enumerate(slots)}
        bounds = np.linspace(0, size, n + 1).astype(int)
        self.share = slice(int(bounds[r]), int(bounds[r + 1]))
        self.exchange = RowExchange.of(comm, net, dtype) if n > 1 else None

    def broadcast(self) -> None:
        """The weights are shared (and were copied from rank 0 across nodes); buffers are not."""
        for buffer in self.net.buffers().values():
            self.comm.bcast_array(buffer)

    def _reduce_buffer(self) -> Any:
        """Rank r sums share r of every row (in rank order: deterministic) or, for the dense layers
        exchanged, computes it from the node's rows; then across nodes. Every rank sums the
        statistics itself, so no rank waits for the others' shares before its update."""
        comm, rows, r = self.comm, self.rows, self.comm.local_rank
        if self.exchange is not None:
            self.exchange.publish(rows[r])
        comm.local.Barrier()  # every row is written
        computed = self.exchange.compute(rows[r], self.share) if self.exchange is not None else []
        for lo, hi in _complement(self.share, computed):
            for k in range(len(rows)):
                if k != r:
                    rows[r, lo:hi] += rows[k, lo:hi]
        if comm.cross.Get_size() == 1:
            stats = rows[0, -STATS:].copy()
            for k in range(1, len(rows)):
                stats += rows[k, -STATS:]
            return stats
        comm.cross.Allreduce(MPI.IN_PLACE, rows[r, self.share], op=MPI.SUM)
        stats = rows[r, -STATS:].copy()
        comm.allreduce_sum(stats)  # over every rank: the same sums everywhere, whatever the node
        return stats

    def start_step(self, backward_passes: int) -> None:
        """Dense rows are exchanged only in a step of one backward pass (not under accumulation)."""
        if self.exchange is not None:
            self.exchange.defer(backward_passes == 1)

    def update(self, finite: Any = True, begun: bool = False) -> None:
        """This rank's share of the update (none unless `finite`: every rank has the same sums); clipping
        uses the norm summed over all shares, and so do layer-wise rules (LARS, LAMB) their per-tensor
        norms (`total`)."""
        if not finite:  # a host boolean: this strategy runs on the CPU only
            return
        opt, part = self.optimizer, self.share
        params, grads = self.net.flat_params[part], self.net.flat_grads[part]
        if opt.clip_norm is not None:
            opt.clip(grads, float(self.comm.local.allreduce(float(np.vdot(grads, grads)), op=MPI.SUM)))
        opt.apply(params, grads, {k: v[part] for k, v in opt.state.items()}, start=part.start,
                  total=lambda partial: self.comm.local.allreduce(partial, op=MPI.SUM))
        self.comm.local.Barrier()  # every share is written before the next forward pass


def _complement(share: slice, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `share` outside the sorted, disjoint `ranges` inside it."""
    parts, at = [], share.start
    for lo, hi in ranges:
        if lo > at:
            parts.append((at, lo))
        at = hi
    if at < share.stop:
        parts.append((at, share.stop))
    return parts


# -- one copy of the prepared data per node (issue 48) ---------------------------------------------
T = TypeVar("T")
MIN_SHARED = 1 << 16  # arrays smaller than this travel with the pickled rest of the value
ALIGN = 64  # each shared array starts on a cache line


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where a lifted array lies in the node's shared memory."""
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def end(self) -> int:
        return self.offset + int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def once_per_node(comm: MPICommunicator, make: Callable[[], T]) -> T:
    """`make()` run by one rank per node (its first); the node's other ranks get the same value, its
    numeric arrays (in dataclass fields, at any depth) mapped read-only from one copy in the node's
    shared memory. A MagmaError is raised on every rank together, as `on_every_rank` raises it.
    Where the node's /dev/shm has no room for the arrays, every rank runs `make()` itself."""
    local = node_split(comm.comm)
    owned = comm._root().owned  # freed at exit (`MPICommunicator.release`), newest first
    owned.append(local)
    first = local.Get_rank() == 0
    value = on_every_rank(comm, lambda: make() if first else None)
    if local.Get_size() == 1:
        return value
    found: list[tuple[_Slot, np.ndarray]] = []
    skeleton = _lift(value, found) if first else None
    nbytes = max((slot.end for slot, _ in found), default=0)
    skeleton, nbytes, fits = local.bcast((skeleton, nbytes, shared_memory_fits(nbytes)) if first else None)
    if not fits:  # no room to share: each rank prepares its own, a refusal said on all of them at once
        mine = value
        return on_every_rank(local, lambda: mine if first else make())
    if nbytes == 0:
        return skeleton
    window = MPI.Win.Allocate_shared(nbytes if first else 0, 1, comm=local)
    owned.append(window)  # before `local`, which it lives on
    memory = np.ndarray((nbytes,), np.uint8, buffer=window.Shared_query(0)[0])
    for slot, array in found:  # on the first rank only
        _view(memory, slot)[...] = array
    del value, found  # the first rank's private copies go: the node keeps the shared one
    local.Barrier()
    return _placed(skeleton, memory)


def _lift(value: Any, found: list[tuple[_Slot, np.ndarray]]) -> Any:
    """`value` with its large numeric arrays replaced by slots (appended to `found` with the arrays)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc" and value.nbytes >= MIN_SHARED:
        start = -(-max((slot.end for slot, _ in found[-1:]), default=0) // ALIGN) * ALIGN
        found.append((_Slot(start, value.shape, value.dtype.str), value))
        return found[-1][0]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _lift(getattr(value, f.name), found)
                                             for f in dataclasses.fields(value) if f.init})
    return value


def _placed(value: Any, memory: np.ndarray) -> Any:
    """`value` with each slot replaced by its read-only array in `memory`."""
    if isinstance(value, _Slot):
        array = _view(memory, value)
        array.flags.writeable = False
        return array
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _placed(getattr(value, f.name), memory)
                                             for f in dataclasses.fields(value) if f.init})
    return value


def _view(memory: np.ndarray, slot: _Slot) -> np.ndarray:
    return memory[slot.offset:slot.end].view(np.dtype(slot.dtype)).reshape(slot.shape)
