"""cupy.cuda.nccl in the stand-in: NCCL's device-to-device collectives, carried by MPI between the
ranks' numpy buffers (nothing is counted as a read or a copy: on a GPU nothing crosses to the host)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as _np

from . import enqueue

available = True
NCCL_FLOAT32, NCCL_FLOAT64, NCCL_FLOAT16, NCCL_BFLOAT16 = 7, 8, 6, 9
NCCL_SUM = 0
_TYPES = {NCCL_FLOAT32: ctypes.c_float, NCCL_FLOAT64: ctypes.c_double}


def get_unique_id() -> tuple:
    return tuple(os.urandom(16))


def _view(ptr: int, count: int, datatype: int) -> _np.ndarray:
    return _np.ctypeslib.as_array((_TYPES[datatype] * count).from_address(ptr))


class NcclCommunicator:
    def __init__(self, ndev: int, comm_id: Any, rank: int) -> None:
        from mpi4py import MPI  # tests only

        self.mpi = MPI
        self.comm = MPI.COMM_WORLD.Split(hash(tuple(comm_id)) & 0x7FFFFFFF, rank)
        if self.comm.size != ndev:
            raise RuntimeError(f"NCCL stand-in: {self.comm.size} ranks joined a communicator of {ndev}")

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: Any) -> None:
        assert op == NCCL_SUM

        def work() -> None:
            recv = _view(recvbuf, count, datatype)
            if sendbuf != recvbuf:
                recv[...] = _view(sendbuf, count, datatype)
            self.comm.Allreduce(self.mpi.IN_PLACE, recv, op=self.mpi.SUM)
        enqueue(work)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: Any) -> None:
        enqueue(lambda: self.comm.Bcast(_view(buff, count, datatype), root=root))
