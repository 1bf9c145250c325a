"""Primitive ops: arithmetic with broadcasting, matmul, pow/exp/log, reductions and shape ops.

Each op keeps `forward` and `backward` side by side; `backward` returns one gradient per input.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import backend as B
from .node import Array, Node, Op, unbroadcast

LOG_EPSILON = 1e-8  # MagmaDNN's stable log: log(max(x, eps))


class Add(Op):
    def forward(self, a: Array, b: Array) -> Array:
        return a + b

    def backward(self, g: Array) -> Sequence[Array]:
        a, b = self.inputs
        return unbroadcast(g, a.value.shape), unbroadcast(g, b.value.shape)


class Sub(Op):
    def forward(self, a: Array, b: Array) -> Array:
        return a - b

    def backward(self, g: Array) -> Sequence[Array]:
        a, b = self.inputs
        return unbroadcast(g, a.value.shape), unbroadcast(-g, b.value.shape)


class Mul(Op):
    def forward(self, a: Array, b: Array) -> Array:
        return a * b

    def backward(self, g: Array) -> Sequence[Array]:
        a, b = self.inputs
        return unbroadcast(g * b.value, a.value.shape), unbroadcast(g * a.value, b.value.shape)


class Div(Op):
    def forward(self, a: Array, b: Array) -> Array:
        return a / b

    def backward(self, g: Array) -> Sequence[Array]:
        a, b = self.inputs
        ga = g / b.value
        return unbroadcast(ga, a.value.shape), unbroadcast(-ga * self.value, b.value.shape)


class Neg(Op):
    def forward(self, a: Array) -> Array:
        return -a

    def backward(self, g: Array) -> Sequence[Array]:
        return (-g,)


class MatMul(Op):
    """2-D matrix product (a batch of rows times a weight matrix)."""

    def forward(self, a: Array, b: Array) -> Array:
        return B.operand(a) @ B.operand(b)

    def backward(self, g: Array) -> Sequence[Array]:
        a, b = self.inputs
        return B.operand(g) @ B.operand(b.value).T, B.operand(a.value).T @ B.operand(g)


class Pow(Op):
    """x ** p for a constant exponent p."""

    def __init__(self, x: Node, exponent: float) -> None:
        super().__init__(x)
        self.exponent = exponent

    def forward(self, x: Array) -> Array:
        return x ** self.exponent

    def backward(self, g: Array) -> Sequence[Array]:
        x = self.inputs[0].value
        return (g * self.exponent * x ** (self.exponent - 1),)


class Exp(Op):
    def forward(self, x: Array) -> Array:
        return B.array_module(x).exp(x)

    def backward(self, g: Array) -> Sequence[Array]:
        return (g * self.value,)


class Log(Op):
    """log(max(x, eps)): finite for x <= 0; the gradient is zero where the guard is active."""

    def forward(self, x: Array) -> Array:
        xp = B.array_module(x)
        return xp.log(xp.maximum(x, LOG_EPSILON))

    def backward(self, g: Array) -> Sequence[Array]:
        x = self.inputs[0].value
        return (g / B.array_module(x).maximum(x, LOG_EPSILON) * (x > LOG_EPSILON),)


class Sum(Op):
    def __init__(self, x: Node, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> None:
        super().__init__(x)
        self.axis, self.keepdims = axis, keepdims

    def forward(self, x: Array) -> Array:
        return x.sum(axis=self.axis, keepdims=self.keepdims)

    def backward(self, g: Array) -> Sequence[Array]:
        return (_expand(g, self.inputs[0].value.shape, self.axis, self.keepdims),)


class Mean(Sum):
    def forward(self, x: Array) -> Array:
        return x.mean(axis=self.axis, keepdims=self.keepdims)

    def backward(self, g: Array) -> Sequence[Array]:
        x = self.inputs[0].value
        axes = range(x.ndim) if self.axis is None else (self.axis,) if isinstance(self.axis, int) else self.axis
        count = int(np.prod([x.shape[a] for a in axes]))  # from the shape: right for an empty batch too
        return (_expand(g, x.shape, self.axis, self.keepdims) * (1.0 / max(count, 1)),)


def _expand(g: Array, shape: tuple[int, ...], axis: int | tuple[int, ...] | None, keepdims: bool) -> Array:
    """Broadcast a reduced gradient back to the input's shape."""
    xp = B.array_module(g)
    if axis is not None and not keepdims:
        axes = (axis,) if isinstance(axis, int) else axis
        g = xp.expand_dims(g, tuple(a % len(shape) for a in axes))
    return xp.broadcast_to(g, shape)


class Reshape(Op):
    """To `shape`, or with `keep_batch` to (batch, *shape) (explicit, so an empty batch works too)."""

    def __init__(self, x: Node, shape: tuple[int, ...], keep_batch: bool = False) -> None:
        super().__init__(x)
        self.target, self.keep_batch = tuple(shape), keep_batch

    def forward(self, x: Array) -> Array:
        return x.reshape((x.shape[0], *self.target) if self.keep_batch else self.target)

    def backward(self, g: Array) -> Sequence[Array]:
        return (g.reshape(self.inputs[0].value.shape),)


class Flatten(Op):
    """(N, d1, d2, ...) -> (N, d1*d2*...)."""

    def forward(self, x: Array) -> Array:
        return x.reshape(x.shape[0], int(np.prod(x.shape[1:])))

    def backward(self, g: Array) -> Sequence[Array]:
        return (g.reshape(self.inputs[0].value.shape),)


class Transpose(Op):
    def __init__(self, x: Node, axes: tuple[int, ...] | None = None) -> None:
        super().__init__(x)
        self.axes = axes

    def forward(self, x: Array) -> Array:
        return x.transpose(self.axes)

    def backward(self, g: Array) -> Sequence[Array]:
        if self.axes is None:
            return (g.transpose(),)
        inverse = tuple(sorted(range(len(self.axes)), key=self.axes.__getitem__))
        return (g.transpose(inverse),)
