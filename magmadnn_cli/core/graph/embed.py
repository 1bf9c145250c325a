"""Category embeddings: encoded rows whose category-code columns become learned vectors."""

from __future__ import annotations

from typing import Any, Sequence

from .. import backend as B
from .node import IN_PLACE, Node, Op

Array = Any


class Embed(Op):
    """[x's other columns, T_1[code_1], ..., T_k[code_k]] for the code columns at `positions` (the
    codes rounded: input scaling may leave 2.9999999); an unseen category's code, -1, gives zeros.
    The tables' gradients are the output gradient's rows added up per code."""

    def __init__(self, x: Node, tables: Sequence[Node], positions: Sequence[int], kept: Sequence[int],
                 name: str = "embed") -> None:
        super().__init__(x, *tables, name=name)
        self.positions, self.kept = list(positions), list(kept)
        self.codes: Array = None
        self.known: Array = None

    def forward(self, x: Array, *tables: Array) -> Array:
        xp = B.array_module(x)
        codes = xp.rint(x[:, self.positions]).astype(xp.int64)
        self.known = (codes >= 0).astype(x.dtype)
        self.codes = xp.maximum(codes, 0)
        vectors = [t[self.codes[:, i]] * self.known[:, i:i + 1] for i, t in enumerate(tables)]
        return xp.concatenate([x[:, self.kept], *vectors], axis=1)

    def backward(self, g: Array) -> Sequence[Array | None]:
        xp = B.array_module(g)
        outs = self.grad_out or (None,) * len(self.inputs)
        grads: list[Any] = [None]  # the codes are data
        start = len(self.kept)
        for i, table in enumerate(self.inputs[1:]):
            width = table.value.shape[1]
            rows = g[:, start:start + width] * self.known[:, i:i + 1]
            target = outs[i + 1] if outs[i + 1] is not None else xp.zeros_like(table.value)
            target[...] = 0
            xp.add.at(target, self.codes[:, i], rows)
            grads.append(IN_PLACE if outs[i + 1] is not None else target)
            start += width
        return grads
