"""The communicator interface the training loop uses: rank, size, bcast, allreduce, barrier, abort.

`SingleProcess` makes every collective a no-op, so the loop has no `if distributed` branches.
"""

from __future__ import annotations

import os
import sys
from typing import Any


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

    def barrier(self) -> None:
        pass

    def abort(self, code: int = 1) -> None:
        sys.exit(code)


class SingleProcess(Communicator):
    """One process: every collective is the identity."""


def launched_ranks() -> int:
    """How many ranks the launcher says it started (0 when not under a launcher)."""
    for key in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"):
        value = os.environ.get(key)
        if value and value.isdigit():
            return int(value)
    return 0


def get_communicator(strategy: str = "allreduce") -> Communicator:
    """MPI when this process runs under an MPI launcher with several ranks, else SingleProcess."""
    if launched_ranks() <= 1:
        return SingleProcess()
    from .mpi import MPICommunicator  # noqa: PLC0415 (mpi4py initializes MPI on import)
    return MPICommunicator(strategy)
