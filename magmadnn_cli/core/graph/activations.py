"""Activation functions: the registry `ACTIVATIONS`, keyed by the config's names.

Each is a value function and a gradient that may use the input `z`, the output `y`, or both.
"""

from __future__ import annotations

import math

import numpy as np

from .. import backend as B
from .kernels import elementwise
from .node import Array


class Activation:
    name = ""
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


class Linear(Activation):
    name = "linear"
    commutes_with_max = True

    def __call__(self, z: Array) -> Array:
        return z

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        return g


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


class Tanh(Activation):
    name = "tanh"

    def __call__(self, z: Array) -> Array:
        return B.array_module(z).tanh(z)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        if B.array_module(y) is not np:
            return elementwise("tanh_grad")(y, g)
        return g * (1.0 - y * y)


class ReLU(Activation):
    name = "relu"
    commutes_with_max = True

    def __call__(self, z: Array) -> Array:
        return B.array_module(z).maximum(z, 0)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        if B.array_module(z) is not np:
            return elementwise("relu_grad")(z, g)
        return g * (z > 0)


class LeakyReLU(Activation):
    name = "leaky_relu"

    def __init__(self, alpha: float = 0.01) -> None:
        self.alpha = alpha
        self.commutes_with_max = alpha >= 0

    def __call__(self, z: Array) -> Array:
        return B.array_module(z).where(z > 0, z, self.alpha * z)

    def grad(self, z: Array, y: Array, g: Array) -> Array:
        return B.array_module(z).where(z > 0, g, self.alpha * g)


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


ACTIVATIONS: dict[str, type[Activation]] = {
    cls.name: cls for cls in (Linear, Sigmoid, Tanh, ReLU, LeakyReLU, ELU, GELU, Softmax, LogSoftmax)
}


def get_activation(name: str, **kwargs: float) -> Activation:
    from ...errors import MagmaError  # noqa: PLC0415
    if name not in ACTIVATIONS:
        raise MagmaError(f"unknown activation {name!r} (expected one of {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name](**kwargs)
