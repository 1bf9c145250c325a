"""NCCL collectives for GPU ranks (`cupy.cuda.nccl`): the gradient buffer is reduced device to
device instead of being staged through host memory for MPI. Created lazily, on the first collective
with a device array (after each rank has picked its GPU); MPI only carries NCCL's unique id."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..core import backend as B


def load_nccl() -> Any | None:
    """cupy's NCCL binding, or None (cupy missing, or built without NCCL); the backend imports it."""
    return B.nccl_module()


class NcclReducer:
    """Sum-allreduce and broadcast of contiguous cupy arrays over `size` ranks."""

    def __init__(self, nccl: Any, rank: int, size: int, bcast: Callable[[Any], Any], stream: Any = None) -> None:
        self.nccl = nccl
        unique_id = bcast(nccl.get_unique_id() if rank == 0 else None)
        self.comm = nccl.NcclCommunicator(size, unique_id, rank)
        self.stream = stream

    def _dtype(self, array: Any) -> int:
        kinds = {np.dtype(np.float32): self.nccl.NCCL_FLOAT32, np.dtype(np.float64): self.nccl.NCCL_FLOAT64}
        if np.dtype(array.dtype) not in kinds:
            raise TypeError(f"NCCL reduction of {array.dtype} arrays is not supported")
        return kinds[np.dtype(array.dtype)]

    def _stream_ptr(self) -> int:
        if self.stream is not None:
            return self.stream
        return B.current().xp.cuda.get_current_stream().ptr

    def allreduce_sum(self, array: Any) -> None:
        if not array.flags.c_contiguous:
            raise ValueError("allreduce_sum needs a contiguous buffer")
        ptr = array.data.ptr
        self.comm.allReduce(ptr, ptr, array.size, self._dtype(array), self.nccl.NCCL_SUM, self._stream_ptr())

    def bcast(self, array: Any, root: int = 0) -> None:
        self.comm.bcast(array.data.ptr, array.size, self._dtype(array), root, self._stream_ptr())
