"""The network's first stage when category columns are embedded (`data.columns.X: {embedding: d}`):
each such column's code becomes a learned d-wide vector, so a column of 10,000 categories adds d
inputs to the first layer, not 10,000. Built from the fitted encoder's `Embedded` columns, not
declared in `model.layers`."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..core.graph import Node
from ..core.graph.embed import Embed
from ..data.columns import Embedded
from .initializers import get_initializer
from .layer_base import Context, Layer, Shape


class ColumnEmbeddings(Layer):
    """Rows of encoded columns -> the other columns, then one vector per embedded column (Keras'
    Embedding per column, initialized uniform in [-0.05, 0.05] as Keras does)."""
    type = "column_embeddings"

    def __init__(self, columns: Sequence[Embedded]) -> None:
        super().__init__(None, "embeddings")  # not declared in model.layers: built from the encoder
        self.columns = list(columns)
        self.kept: list[int] = []

    def compute_shape(self, input_shape: Shape) -> Shape:
        positions = {c.position for c in self.columns}
        self.kept = [j for j in range(input_shape[0]) if j not in positions]
        for c in self.columns:
            self.add_weight(c.name, (c.vocabulary, c.width), get_initializer({"type": "uniform", "limit": 0.05}), c.vocabulary, c.width)
        return (len(self.kept) + sum(c.width for c in self.columns),)

    def __call__(self, x: Node, ctx: Context) -> Node:
        return Embed(x, [self.weights[c.name] for c in self.columns], [c.position for c in self.columns], self.kept,
                     name=self.name)

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        """The same in ONNX: the codes gathered from each table (an unseen code, -1, zeros)."""
        parts = [g.op("Gather", x, g.const(np.array(self.kept), "kept", np.int64), axis=1)]
        for c in self.columns:
            code = g.op("Gather", x, g.const(np.array([c.position]), f"{c.name}_at", np.int64), axis=1)
            code = g.op("Cast", g.op("Round", code), to=g.onnx.TensorProto.INT64)
            zero = g.const(np.array(0), "zero_code", np.int64)
            known = g.op("Cast", g.op("GreaterOrEqual", code, zero), to=g.onnx.TensorProto.FLOAT)
            table = self.onnx_weight(g, weights, c.name)
            vector = g.op("Gather", table, g.op("Max", code, zero), axis=0)  # (N, 1, d)
            parts.append(g.op("Mul", g.op("Flatten", vector, axis=1), known))
        return g.op("Concat", *parts, axis=1)

    def flops(self) -> int:
        return sum(c.width for c in self.columns)
