"""A streamed epoch's rows between ranks (issue 48): each rank reads its own blocks of the file, so
the rows of a global batch lie on several ranks; before each step every rank sends every other the
rows it holds of that rank's share of the batch (one MPI alltoall), and receives its own share's."""

from __future__ import annotations

from typing import Any

import numpy as np

Rows = tuple[np.ndarray, ...]


def exchange_rows(comm: Any, outgoing: list[Rows]) -> list[Rows]:
    """`outgoing[d]`: the arrays this rank sends rank d (itself included); returns the arrays each
    rank sent this one, by sending rank. One process keeps what it has."""
    if comm.size == 1:
        return outgoing
    with comm.waiting("the exchange of a streamed batch's rows"):
        return comm.comm.alltoall(outgoing)
