"""Neural-network ops: activations, the fused dense layer, dropout, and the fused losses."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from .. import backend as B
from .activations import Activation
from .node import IN_PLACE, Array, Node, Op


class Mode:
    """Train or eval; shared by the ops whose behaviour depends on it (dropout, batchnorm)."""

    def __init__(self) -> None:
        self.training = False


class Activate(Op):
    def __init__(self, x: Node, fn: Activation) -> None:
        super().__init__(x, name=fn.name)
        self.fn = fn

    def forward(self, x: Array) -> Array:
        return self.fn(x)

    def backward(self, g: Array) -> Sequence[Array]:
        return (self.fn.grad(self.inputs[0].value, self.value, g),)


class Dense(Op):
    """y = act(x @ W + b): one node, so the pre-activation never leaves it."""

    def __init__(self, x: Node, w: Node, b: Node | None, fn: Activation, name: str = "dense") -> None:
        super().__init__(*((x, w) if b is None else (x, w, b)), name=name)
        self.fn = fn
        self.z: Array | None = None

    def forward(self, x: Array, w: Array, b: Array | None = None) -> Array:
        z = x @ w
        if b is not None:
            z += b
        self.z = z  # (overwritten by activations whose gradient needs only their output)
        return self.fn.in_place(z)

    def backward(self, g: Array) -> Sequence[Array | None]:
        x, w = self.inputs[0], self.inputs[1]
        dz = self.fn.grad(self.z, self.value, g)
        grads: list[Any] = [dz @ w.value.T if x.requires_grad else None]
        outs = self.grad_out or (None,) * len(self.inputs)
        if outs[1] is not None:  # the weight gradient GEMM writes straight into the flat buffer
            B.array_module(dz).matmul(x.value.T, dz, out=outs[1])
            grads.append(IN_PLACE)
        else:
            grads.append(x.value.T @ dz)
        if len(self.inputs) == 3:
            if outs[2] is not None:
                column_sums(dz, out=outs[2])
                grads.append(IN_PLACE)
            else:
                grads.append(column_sums(dz))
        return grads


def column_sums(a: Array, out: Array | None = None) -> Array:
    """a.sum(axis=0) of a 2-D array; on the CPU as ones @ a, which BLAS does twice as fast."""
    if B.array_module(a) is not np:
        return a.sum(axis=0, out=out)
    return np.matmul(_ones(a.shape[0], a.dtype), a, out=out)


@functools.cache
def _ones(n: int, dtype: Any) -> np.ndarray:
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones


class Dropout(Op):
    """Inverted dropout: in training, zero each value with probability `rate` and scale the rest
    by 1 / (1 - rate); in eval mode the identity."""

    def __init__(self, x: Node, rate: float, mode: Mode, rng: Any) -> None:
        super().__init__(x)
        self.rate, self.mode, self.rng = rate, mode, rng
        self.mask: Array | None = None

    def forward(self, x: Array) -> Array:
        if not self.mode.training or self.rate == 0.0:
            self.mask = None
            return x
        keep = self.rng.random(x.shape, dtype=x.dtype) >= self.rate
        self.mask = keep * x.dtype.type(1.0 / (1.0 - self.rate))
        return x * self.mask

    def backward(self, g: Array) -> Sequence[Array]:
        return (g if self.mask is None else g * self.mask,)


class SoftmaxCrossEntropy(Op):
    """mean_i -log softmax(z_i)[y_i], fused and stable; gradient (softmax(z) - onehot(y)) / N.
    Targets are class indices of shape (N,) or one-hot/probability rows of shape (N, C)."""

    def forward(self, z: Array, y: Array) -> Array:
        xp = B.array_module(z)
        shifted = z - z.max(axis=1, keepdims=True)
        e = xp.exp(shifted)
        s = e.sum(axis=1, keepdims=True)
        self.p = e / s
        logp = shifted - xp.log(s)
        n = z.shape[0]
        if y.ndim == 1:
            return -logp[xp.arange(n), y].mean()
        return -(y * logp).sum() / n

    def backward(self, g: Array) -> Sequence[Array | None]:
        z, y = (i.value for i in self.inputs)
        xp = B.array_module(z)
        d = self.p.copy()
        n = z.shape[0]
        if y.ndim == 1:
            d[xp.arange(n), y] -= 1.0
        else:
            d -= y
        return d * (g / n), None


class BinaryCrossEntropy(Op):
    """mean -[y log p + (1-y) log(1-p)]. From logits z (p = sigmoid(z), computed stably as
    max(z,0) - z y + log(1 + exp(-|z|)), gradient (p - y)/N) or from probabilities p (clipped)."""

    EPS = 1e-7

    def __init__(self, pred: Node, target: Node, from_logits: bool = True) -> None:
        super().__init__(pred, target)
        self.from_logits = from_logits

    def forward(self, z: Array, y: Array) -> Array:
        xp = B.array_module(z)
        if self.from_logits:
            return (xp.maximum(z, 0) - z * y + xp.log1p(xp.exp(-xp.abs(z)))).mean()
        p = xp.clip(z, self.EPS, 1 - self.EPS)
        return -(y * xp.log(p) + (1 - y) * xp.log(1 - p)).mean()

    def backward(self, g: Array) -> Sequence[Array | None]:
        z, y = (i.value for i in self.inputs)
        xp = B.array_module(z)
        if self.from_logits:
            p = 0.5 * (1 + xp.tanh(0.5 * z))
            return (p - y) * (g / z.size), None
        p = xp.clip(z, self.EPS, 1 - self.EPS)
        inside = (z > self.EPS) & (z < 1 - self.EPS)
        return (p - y) / (p * (1 - p)) * inside * (g / z.size), None


class MeanSquaredError(Op):
    """mean (pred - y)^2 over all elements."""

    def forward(self, p: Array, y: Array) -> Array:
        self.diff = p - y
        return (self.diff * self.diff).mean()

    def backward(self, g: Array) -> Sequence[Array | None]:
        return self.diff * (2.0 * g / self.diff.size), None


class MeanAbsoluteError(Op):
    """mean |pred - y| over all elements (subgradient 0 at equality)."""

    def forward(self, p: Array, y: Array) -> Array:
        self.diff = p - y
        return B.array_module(p).abs(self.diff).mean()

    def backward(self, g: Array) -> Sequence[Array | None]:
        return B.array_module(self.diff).sign(self.diff) * (g / self.diff.size), None


class BatchNorm(Op):
    """y = gamma (x - mean) / sqrt(var + eps) + beta, per feature (axis 1). Training: batch statistics
    (over the batch, and the spatial axes for NCHW), and the running statistics move towards them;
    eval: the running statistics (Ioffe & Szegedy 2015)."""

    def __init__(self, x: Node, gamma: Node, beta: Node, running_mean: Array, running_var: Array,
                 mode: Mode, momentum: float = 0.9, epsilon: float = 1e-5) -> None:
        super().__init__(x, gamma, beta, name="batchnorm")
        self.running_mean, self.running_var = running_mean, running_var
        self.mode, self.momentum, self.epsilon = mode, momentum, epsilon

    def _axes(self, x: Array) -> tuple[int, ...]:
        return (0,) + tuple(range(2, x.ndim))

    def _shape(self, x: Array) -> tuple[int, ...]:
        return (1, x.shape[1]) + (1,) * (x.ndim - 2)

    def forward(self, x: Array, gamma: Array, beta: Array) -> Array:
        xp = B.array_module(x)
        axes, shape = self._axes(x), self._shape(x)
        if self.mode.training:
            mean, var = x.mean(axis=axes), x.var(axis=axes)
            count = x.size // x.shape[1]
            m = self.momentum
            self.running_mean[...] = m * self.running_mean + (1 - m) * mean
            self.running_var[...] = m * self.running_var + (1 - m) * var * (count / max(1, count - 1))
        else:
            mean, var = self.running_mean, self.running_var
        self.inv_std = (1.0 / xp.sqrt(var + self.epsilon)).reshape(shape)
        self.xhat = (x - mean.reshape(shape)) * self.inv_std
        return gamma.reshape(shape) * self.xhat + beta.reshape(shape)

    def backward(self, g: Array) -> Sequence[Array]:
        x, gamma = self.inputs[0].value, self.inputs[1].value
        axes, shape = self._axes(x), self._shape(x)
        dgamma, dbeta = (g * self.xhat).sum(axis=axes), g.sum(axis=axes)
        dxhat = g * gamma.reshape(shape)
        if not self.mode.training:
            return dxhat * self.inv_std, dgamma, dbeta
        count = x.size // x.shape[1]
        dx = (dxhat - dxhat.sum(axis=axes, keepdims=True) / count
              - self.xhat * (dxhat * self.xhat).sum(axis=axes, keepdims=True) / count) * self.inv_std
        return dx, dgamma, dbeta
