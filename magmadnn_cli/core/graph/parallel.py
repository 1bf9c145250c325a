"""The two ops of a column-split layer (Megatron's f and g): `ToParts` (forward: the whole input to
every part; backward: the parts' input gradients summed over the group) and `GatherColumns` (forward:
the parts' output columns allgathered into the whole output; backward: this part's columns of the
gradient). `group` is any object with `rank`, `allreduce_sum(flat)` and `allgather_array(flat,
counts)` (a communicator; the graph does not know MPI)."""

from __future__ import annotations

from typing import Any, Sequence

from .. import backend as B
from .node import Node, Op

Array = Any


class ToParts(Op):
    """Identity forward; backward sums the input gradient over the group (each part contributed
    its columns' share of x's gradient)."""

    def __init__(self, x: Node, group: Any) -> None:
        super().__init__(x, name="to_parts")
        self.group = group

    def forward(self, x: Array) -> Array:
        return x

    def backward(self, g: Array) -> Sequence[Array]:
        total = B.array_module(g).array(g, copy=True)  # g may be another node's array
        self.group.allreduce_sum(total.reshape(-1))
        return (total,)


class GatherColumns(Op):
    """(N, widths[rank]) on each rank -> (N, sum(widths)) on every rank, columns in rank order."""

    def __init__(self, part: Node, group: Any, widths: list[int]) -> None:
        super().__init__(part, name="gather_columns")
        self.group, self.widths = group, widths
        start = sum(widths[:group.rank])
        self.columns = slice(start, start + widths[group.rank])

    def forward(self, part: Array) -> Array:
        n = part.shape[0]
        flat = self.group.allgather_array(part, [n * w for w in self.widths])
        xp = B.array_module(flat)
        pieces, offset = [], 0
        for w in self.widths:
            pieces.append(flat[offset:offset + n * w].reshape(n, w))
            offset += n * w
        return xp.concatenate(pieces, axis=1)

    def backward(self, g: Array) -> Sequence[Array]:
        return (B.array_module(g).ascontiguousarray(g[:, self.columns]),)
