"""The `shared_memory` strategy: ranks on one node keep ONE copy of the weights and of the optimizer
state in MPI shared memory, and split both the gradient reduction and the update between them.

Each rank's backward pass writes its gradients (and the step's loss/accuracy/stop slots) into its
own row of a shared array. A reduction is then: every node-local rank sums its share of the rows
(always in the same order, so results are deterministic), the sums of each share are allreduced
across nodes among the ranks holding the same share, and after the reduction every rank updates
only its share of the shared weights. Within a node no gradient travels through MPI buffers and the
optimizer's work is divided N ways; the weights need no broadcast afterwards, being shared.
CPU only: on a GPU it falls back to MPI's allreduce. Strategy `auto` (the default) uses it when
all ranks share one node and MPI's allreduce otherwise; `shared_memory` uses it across nodes too.
MAGMADNN_RANKS_PER_NODE=N makes every N consecutive ranks a "node", to run the multi-node path on
one machine (the tests do).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from ..core import backend as B
from ..errors import MagmaError
from ..nn.network import STATS
from .comm import shared_memory_fits
from .mpi import MPICommunicator


class SharedMemoryCommunicator(MPICommunicator):
    def __init__(self, across_nodes: bool = True) -> None:
        super().__init__("allreduce")
        self.across_nodes = across_nodes
        fake = os.environ.get("MAGMADNN_RANKS_PER_NODE", "")
        if fake.isdigit() and int(fake) > 0:  # treat every N consecutive ranks as a node (to test on one machine)
            self.local = self.comm.Split(self.rank // int(fake), self.rank)
        else:
            self.local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = self.local.Get_rank(), self.local.Get_size()
        per_node = self.comm.allgather(self.local.Get_size())
        if len(set(per_node)) != 1 and across_nodes:
            raise MagmaError("distributed.strategy shared_memory needs the same number of ranks on every node "
                             f"(found {sorted(set(per_node))}); use allreduce")
        self.cross = self.comm.Split(self.local_rank, self.rank)  # the same share on every node
        self.active = False
        self.window: Any = None

    def share(self, network: Any, optimizer: Any) -> None:
        if B.device != "cpu" or (self.local_size < self.size and not self.across_nodes):
            super().share(network, optimizer)
            return
        n, r = self.local_size, self.local_rank
        size, slots = network.flat_params.size, tuple(optimizer.slots)
        row = size + STATS
        dtype = network.flat_params.dtype
        total = size * (1 + len(slots)) + n * row
        if not self.comm.allreduce(shared_memory_fits(total * dtype.itemsize), op=MPI.LAND):
            if self.rank == 0:
                print(f"warning: /dev/shm has less than the {total * dtype.itemsize / 2**20:.0f} MiB the "
                      "shared_memory strategy needs (a container's default is 64 MiB: docker run "
                      "--shm-size); using MPI allreduce instead", file=sys.stderr)
            super().share(network, optimizer)
            return
        self.window = MPI.Win.Allocate_shared(total * dtype.itemsize if r == 0 else 0, dtype.itemsize,
                                              comm=self.local)
        memory = np.ndarray((total,), dtype=dtype, buffer=self.window.Shared_query(0)[0])
        params = memory[:size]
        state = memory[size:size * (1 + len(slots))].reshape(len(slots), size)
        self.rows = memory[size * (1 + len(slots)):].reshape(n, row)
        if r == 0:  # this node's copy: rank 0's weights, then fresh optimizer state
            params[...] = network.flat_params
            self.cross.Bcast(params, root=0)
            state.fill(0)
        self.local.Barrier()
        self.my_row = self.rows[r]
        network.place(params, self.my_row)
        optimizer.state = {name: state[i] for i, name in enumerate(slots)}
        bounds = np.linspace(0, row, n + 1).astype(int)
        self.lo, self.hi = int(bounds[r]), int(bounds[r + 1])
        self.n_params, self.active = size, True

    def allreduce_sum(self, array: Any) -> None:
        if not self.active or array is not self.my_row:  # e.g. evaluation sums: plain MPI
            super().allreduce_sum(array)
            return
        r, rows, part = self.local_rank, self.rows, slice(self.lo, self.hi)
        self.local.Barrier()  # every row is written
        mine = rows[r, part]
        for k in range(len(rows)):
            if k != r:
                mine += rows[k, part]
        if self.cross.Get_size() > 1:
            self.cross.Allreduce(MPI.IN_PLACE, mine, op=MPI.SUM)
        self.local.Barrier()  # every share is summed
        last = len(rows) - 1  # the step's loss/accuracy/stop slots end the last share
        if r != last:
            rows[r, self.n_params:] = rows[last, self.n_params:]

    def update_share(self, size: int) -> slice:
        if not self.active:
            return slice(None)
        return slice(min(self.lo, size), min(self.hi, size))

    def sum_shares(self, value: float) -> float:
        return float(self.local.allreduce(value, op=MPI.SUM)) if self.active else value

    def update_done(self) -> None:
        if self.active:
            self.local.Barrier()

