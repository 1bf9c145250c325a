"""Activation functions: the registry `ACTIVATIONS`, keyed by the config's names, each class the
implementation of one declaration (`config/activations.py`: name, alpha, output range).

Each is a value function, a gradient that may use the input `z`, the output `y`, or both, and its
ONNX form (`onnx`, on the exporter's graph builder: ops by name, constants).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend as B
from .kernels import elementwise
from .node import Array


class Activation:
    name = ""  # the declaration's name (`config/activations.py`)
    # Piecewise linear and non-decreasing: a max over a window commutes with it exactly, with the
    # same first maximum, so pooling may run before it (on the smaller array).
    commutes_with_max = False
    row_wise = False  # each output depends on the whole row (softmax): not computable on a slice of it

    def __call__(self, z: Array) -> Array:
        raise NotImplementedError  # abstract

    def in_place(self, z: Array) -> Array:
        """The activation of a `z` its caller no longer needs. Activations whose gradient uses only
        the output may compute it over z's own memory (one allocation and pass fewer)."""
        return self(z)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        """d(loss)/dz given g = d(loss)/dy."""
        raise NotImplementedError  # abstract

    def onnx(self, g: Any, z: str) -> str:
        """The activation of graph value `z` in `g` (the ONNX exporter's builder); returns the output's name."""
        raise NotImplementedError  # abstract


class Linear(Activation):
    name = "linear"
    commutes_with_max = True

    def __call__(self, z: Array) -> Array:
        return z

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        return g

    def onnx(self, g: Any, z: str) -> str:
        return z


class Sigmoid(Activation):
    """1 / (1 + exp(-z)), computed as 0.5 * (1 + tanh(z / 2)) so it never overflows."""
    name = "sigmoid"

    def __call__(self, z: Array) -> Array:
        if B.array_module(z) is not np:
            return elementwise("sigmoid")(z)
        return self._from_half(np.multiply(z, 0.5))

    def in_place(self, z: Array) -> Array:
        if B.array_module(z) is not np:
            return elementwise("sigmoid")(z)
        z *= 0.5
        return self._from_half(z)

    @staticmethod
    def _from_half(h: np.ndarray) -> np.ndarray:
        """h = z / 2  ->  0.5 * (1 + tanh(h)), in place."""
        np.tanh(h, out=h)
        h += 1.0
        h *= 0.5
        return h

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        if B.array_module(y) is not np:
            return elementwise("sigmoid_grad")(y, g)
        d = 1.0 - y  # one temporary, then in place: g * y * (1 - y)
        d *= y
        d *= g
        return d

    def onnx(self, g: Any, z: str) -> str:
        return g.op("Sigmoid", z)


class Tanh(Activation):
    name = "tanh"

    def __call__(self, z: Array) -> Array:
        return B.array_module(z).tanh(z)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        if B.array_module(y) is not np:
            return elementwise("tanh_grad")(y, g)
        return g * (1.0 - y * y)

    def onnx(self, g: Any, z: str) -> str:
        return g.op("Tanh", z)


class ReLU(Activation):
    name = "relu"
    commutes_with_max = True

    def __call__(self, z: Array) -> Array:
        return B.array_module(z).maximum(z, 0)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        if B.array_module(z) is not np:
            return elementwise("relu_grad")(z, g)
        return g * (z > 0)

    def onnx(self, g: Any, z: str) -> str:
        return g.op("Relu", z)


class LeakyReLU(Activation):
    name = "leaky_relu"

    def __init__(self, alpha: float = 0.01) -> None:
        self.alpha = alpha
        self.commutes_with_max = alpha >= 0

    def __call__(self, z: Array) -> Array:
        return B.array_module(z).where(z > 0, z, self.alpha * z)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        return B.array_module(z).where(z > 0, g, self.alpha * g)

    def onnx(self, g: Any, z: str) -> str:
        return g.op("LeakyRelu", z, alpha=self.alpha)


class ELU(Activation):
    """z for z > 0, alpha * (exp(z) - 1) otherwise."""
    name = "elu"

    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = alpha

    def __call__(self, z: Array) -> Array:
        xp = B.array_module(z)
        return xp.where(z > 0, z, self.alpha * xp.expm1(xp.minimum(z, 0)))

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        return B.array_module(z).where(z > 0, g, g * (y + self.alpha))

    def onnx(self, g: Any, z: str) -> str:
        return g.op("Elu", z, alpha=self.alpha)


class GELU(Activation):
    """0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))), the tanh form of Hendrycks & Gimpel."""
    name = "gelu"
    _c = math.sqrt(2.0 / math.pi)

    def __call__(self, z: Array) -> Array:
        t = B.array_module(z).tanh(self._c * (z + 0.044715 * z ** 3))
        return 0.5 * z * (1.0 + t)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        t = B.array_module(z).tanh(self._c * (z + 0.044715 * z ** 3))
        dt = (1.0 - t * t) * self._c * (1.0 + 3 * 0.044715 * z * z)
        return g * (0.5 * (1.0 + t) + 0.5 * z * dt)

    def onnx(self, g: Any, z: str) -> str:
        cube = g.op("Mul", g.op("Mul", z, z), z)
        inner = g.op("Mul", g.op("Add", z, g.op("Mul", cube, g.const(np.float32(0.044715), "k"))),
                     g.const(np.float32(self._c), "c"))
        return g.op("Mul", g.op("Mul", z, g.const(np.float32(0.5), "half")),
                    g.op("Add", g.op("Tanh", inner), g.const(np.float32(1.0), "one")))


class SiLU(Activation):
    """z sigmoid(z) (Elfwing et al. 2018; swish with beta 1): smooth, non-monotonic below zero."""
    name = "silu"

    def __call__(self, z: Array) -> Array:
        return z * Sigmoid()(z)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        s = Sigmoid()(z)
        return g * (s + y * (1.0 - s))  # d/dz z s(z) = s + z s (1 - s) = s + y (1 - s)

    def onnx(self, g: Any, z: str) -> str:
        return g.op("Mul", z, g.op("Sigmoid", z))


class Softmax(Activation):
    """exp(z - max z) / sum exp(z - max z) over the last axis."""
    name = "softmax"
    row_wise = True

    def __call__(self, z: Array) -> Array:
        xp = B.array_module(z)
        e = xp.exp(z - z.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        return e

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        return y * (g - (g * y).sum(axis=-1, keepdims=True))

    def onnx(self, g: Any, z: str) -> str:
        return g.op("Softmax", z, axis=-1)


class LogSoftmax(Activation):
    """z - logsumexp(z) over the last axis."""
    name = "log_softmax"
    row_wise = True

    def __call__(self, z: Array) -> Array:
        xp = B.array_module(z)
        shifted = z - z.max(axis=-1, keepdims=True)
        return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        return g - B.array_module(y).exp(y) * g.sum(axis=-1, keepdims=True)

    def onnx(self, g: Any, z: str) -> str:
        return g.op("LogSoftmax", z, axis=-1)


ACTIVATIONS: dict[str, type[Activation]] = {cls.name: cls for cls in Activation.__subclasses__()}


def get_activation(name: str, **kwargs: float) -> Activation:
    """The activation `name` with its parameters (`alpha`; configs pass their declared default,
    `config/activations.py`, which a test keeps equal to the classes' own)."""
    from ...errors import MagmaError
    if name not in ACTIVATIONS:
        raise MagmaError(f"unknown activation {name!r} (expected one of {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name](**kwargs)
