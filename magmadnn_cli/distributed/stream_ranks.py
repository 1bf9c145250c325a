"""A streamed run's ranks (issue 48). The fitting passes: each rank surveys and encodes its share of
the blocks, and the statistics are merged through `fit_ranks`' allgather (data/stream_fit.py). The
epochs: each rank reads its own blocks of the file, so the rows of a global batch lie on several
ranks; before each step every rank sends every other the rows it holds of that rank's share of the
batch (one MPI alltoall), and receives its own share's."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data.stream_fit import FitRanks
from .comm import on_every_rank

Rows = tuple[np.ndarray, ...]


def exchange_rows(comm: Any, outgoing: list[Rows]) -> list[Rows]:
    """`outgoing[d]`: the arrays this rank sends rank d (itself included); returns the arrays each
    rank sent this one, by sending rank. One process keeps what it has."""
    if comm.size == 1:
        return outgoing
    with comm.waiting("the exchange of a streamed batch's rows"):
        return comm.comm.alltoall(outgoing)


def fit_ranks(comm: Any) -> FitRanks:
    """The ranks of `comm` splitting a streamed run's fitting passes: each rank's results allgathered,
    a MagmaError on any rank raised on every rank together (`on_every_rank`)."""
    if comm.size == 1:
        return FitRanks()
    return FitRanks(comm.rank, comm.size, lambda make: comm.allgather(on_every_rank(comm, make)),
                    lambda make: on_every_rank(comm, make))
