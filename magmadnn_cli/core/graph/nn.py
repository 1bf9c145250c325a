"""Neural-network ops: activations, the fused dense layer, dropout, and the fused losses."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import backend as B
from ..counter_random import derive_key, keep_mask
from .activations import Activation
from .node import IN_PLACE, Array, Node, Op, column_sums


Reduce = Callable[[Array], None]


class Mode:
    """What the ops whose behaviour depends on the step read (dropout, batchnorm): train or eval and,
    in training, the batch rows' positions in the epoch's global sample order with the epoch's random
    key (so a row's random numbers do not depend on which rank holds it), and `reduce`, which sums an
    array over data-parallel ranks in place (None in one process, or for per-rank batch statistics)."""

    def __init__(self) -> None:
        self.training = False
        self.key = 0
        self.positions: Array | None = None
        self.reduce: Reduce | None = None

    def set_batch(self, key: int, positions: Array) -> None:
        self.key, self.positions = key, positions

    def sum_over_ranks(self, array: Array) -> Array:
        if self.reduce is not None:
            self.reduce(array)
        return array


class Activate(Op):
    def __init__(self, x: Node, fn: Activation) -> None:
        super().__init__(x, name=fn.name)
        self.fn = fn

    def forward(self, x: Array) -> Array:
        return self.fn(x)

    def backward(self, g: Array) -> Sequence[Array]:
        return (self.fn.grad(self.inputs[0].value, self.value, g),)


class Dense(Op):
    """y = act(x @ W + b): one node, so the pre-activation never leaves it.

    `deferral`, when set (by a data-parallel strategy), takes the backward pass's rows (x, dz)
    instead of this op writing x^T dz into the flat buffer: it writes it there itself before the
    update, from every rank's rows (see `distributed.row_exchange`)."""

    def __init__(self, x: Node, w: Node, b: Node | None, fn: Activation, name: str = "dense") -> None:
        super().__init__(*((x, w) if b is None else (x, w, b)), name=name)
        self.fn = fn
        self.z: Array | None = None
        self.deferral: Any = None

    def forward(self, x: Array, w: Array, b: Array | None = None) -> Array:
        z = B.operand(x) @ B.operand(w)
        if b is not None:
            z += b
        self.z = z  # (overwritten by activations whose gradient needs only their output)
        return self.fn.in_place(z)

    def backward(self, g: Array) -> Sequence[Array | None]:
        x, w = self.inputs[0], self.inputs[1]
        dz = self.fn.grad(self.z, self.value, g)
        grads: list[Any] = [B.operand(dz) @ B.operand(w.value).T if x.requires_grad else None]
        outs = self.grad_out or (None,) * len(self.inputs)
        if outs[1] is not None:  # the weight gradient goes straight into the flat buffer
            if self.deferral is not None:
                self.deferral.take(self, x.value, dz)  # which writes it there before the update
            else:
                B.array_module(dz).matmul(B.operand(x.value).T, B.operand(dz), out=outs[1])
            grads.append(IN_PLACE)
        else:
            grads.append(B.operand(x.value).T @ B.operand(dz))
        if len(self.inputs) == 3:
            if outs[2] is not None:
                column_sums(dz, out=outs[2])
                grads.append(IN_PLACE)
            else:
                grads.append(column_sums(dz))
        return grads


class Dropout(Op):
    """Inverted dropout: in training, zero each value with probability `rate` and scale the rest
    by 1 / (1 - rate); in eval mode the identity. The mask of a row is drawn from a counter-based
    generator keyed by (epoch key, `stream`) at the row's global position: the same on any rank count."""

    def __init__(self, x: Node, rate: float, mode: Mode, stream: int) -> None:
        super().__init__(x)
        self.rate, self.mode, self.stream = rate, mode, stream
        self.mask: Array | None = None

    def forward(self, x: Array) -> Array:
        mode = self.mode
        if not mode.training or self.rate == 0.0:
            self.mask = None
            return x
        if mode.positions is None or len(mode.positions) != len(x):
            raise ValueError("dropout in training needs the batch rows' positions (Mode.set_batch)")
        xp = B.array_module(x)
        self.mask = keep_mask(derive_key(mode.key, self.stream), mode.positions, x.shape, self.rate,
                              x.dtype.type, xp)
        return x * self.mask

    def backward(self, g: Array) -> Sequence[Array]:
        return (g if self.mask is None else g * self.mask,)


class SoftmaxCrossEntropy(Op):
    """mean_i w_i * -log softmax(z_i)[y_i], fused and stable; gradient w_i (softmax(z) - onehot(y)) / N.
    Targets are class indices of shape (N,) or one-hot/probability rows of shape (N, C). `weights`
    (per class, set by the network while training; None: all 1) weigh each row by its class."""

    weights: Array | None = None

    def _row_weights(self, y: Array) -> Array | None:
        if self.weights is None:
            return None
        return self.weights[y] if y.ndim == 1 else y @ self.weights

    def forward(self, z: Array, y: Array) -> Array:
        xp = B.array_module(z)
        shifted = z - z.max(axis=1, keepdims=True)
        e = xp.exp(shifted)
        s = e.sum(axis=1, keepdims=True)
        self.p = e / s
        logp = shifted - xp.log(s)
        n = z.shape[0]
        rows = -logp[xp.arange(n), y] if y.ndim == 1 else -(y * logp).sum(axis=1)
        w = self._row_weights(y)
        return (rows if w is None else rows * w).sum() / max(n, 1)

    def backward(self, g: Array) -> Sequence[Array | None]:
        z, y = (i.value for i in self.inputs)
        xp = B.array_module(z)
        d = self.p.copy()
        n = z.shape[0]
        if y.ndim == 1:
            d[xp.arange(n), y] -= 1.0
        else:
            d -= y
        w = self._row_weights(y)
        if w is not None:
            d *= w[:, None]
        return d * (g / max(n, 1)), None


class BinaryCrossEntropy(Op):
    """mean w(y) * -[y log p + (1-y) log(1-p)]. From logits z (p = sigmoid(z), computed stably as
    max(z,0) - z y + log(1 + exp(-|z|)), gradient (p - y)/N) or from probabilities p (clipped).
    `weights` = (w0, w1) per class while training (None: 1)."""

    EPS = 1e-7
    weights: Array | None = None

    def __init__(self, pred: Node, target: Node, from_logits: bool = True) -> None:
        super().__init__(pred, target)
        self.from_logits = from_logits

    def _weighted(self, values: Array, y: Array) -> Array:
        return values if self.weights is None else values * (self.weights[0] + (self.weights[1] - self.weights[0]) * y)

    def forward(self, z: Array, y: Array) -> Array:
        xp = B.array_module(z)
        if self.from_logits:
            rows = xp.maximum(z, 0) - z * y + xp.log1p(xp.exp(-xp.abs(z)))
        else:
            p = xp.clip(z, self.EPS, 1 - self.EPS)
            rows = -(y * xp.log(p) + (1 - y) * xp.log(1 - p))
        return self._weighted(rows, y).sum() / max(z.size, 1)

    def backward(self, g: Array) -> Sequence[Array | None]:
        z, y = (i.value for i in self.inputs)
        xp = B.array_module(z)
        if self.from_logits:
            p = 0.5 * (1 + xp.tanh(0.5 * z))
            return self._weighted(p - y, y) * (g / max(z.size, 1)), None
        p = xp.clip(z, self.EPS, 1 - self.EPS)
        inside = (z > self.EPS) & (z < 1 - self.EPS)
        return self._weighted((p - y) / (p * (1 - p)) * inside, y) * (g / max(z.size, 1)), None


class MeanSquaredError(Op):
    """mean (pred - y)^2 over all elements."""

    def forward(self, p: Array, y: Array) -> Array:
        self.diff = p - y
        flat = self.diff.ravel(order="K")  # a view: numpy gives the difference one block of memory
        return B.array_module(p).dot(flat, flat) / max(self.diff.size, 1)  # BLAS: faster than (d * d).sum()

    def backward(self, g: Array) -> Sequence[Array | None]:
        return self.diff * (2.0 * g / max(self.diff.size, 1)), None


class MeanAbsoluteError(Op):
    """mean |pred - y| over all elements (subgradient 0 at equality)."""

    def forward(self, p: Array, y: Array) -> Array:
        self.diff = p - y
        return B.array_module(p).abs(self.diff).sum() / max(self.diff.size, 1)

    def backward(self, g: Array) -> Sequence[Array | None]:
        return B.array_module(self.diff).sign(self.diff) * (g / max(self.diff.size, 1)), None


class BatchNorm(Op):
    """y = gamma (x - mean) / sqrt(var + eps) + beta, per feature (axis 1). Training: batch statistics
    (over the batch, and the spatial axes for NCHW), and the running statistics move towards them;
    eval: the running statistics (Ioffe & Szegedy 2015). Under data parallelism the batch is the
    global batch (PyTorch's SyncBatchNorm): `mode.sum_over_ranks` adds the per-feature sums of every
    rank, in the forward pass (count, sum, then squared deviations: two passes, as stable as one
    process) and the backward pass, so each rank computes what one process computes for its rows."""

    def __init__(self, x: Node, gamma: Node, beta: Node, running_mean: Array, running_var: Array,
                 mode: Mode, momentum: float = 0.9, epsilon: float = 1e-5) -> None:
        super().__init__(x, gamma, beta, name="batchnorm")
        self.running_mean, self.running_var = running_mean, running_var
        self.mode, self.momentum, self.epsilon = mode, momentum, epsilon
        self.count = 1

    def _axes(self, x: Array) -> tuple[int, ...]:
        return (0,) + tuple(range(2, x.ndim))

    def _shape(self, x: Array) -> tuple[int, ...]:
        return (1, x.shape[1]) + (1,) * (x.ndim - 2)

    def _batch_statistics(self, x: Array) -> tuple[Array, Array]:
        xp, axes, features = B.array_module(x), self._axes(x), x.shape[1]
        sums = xp.empty(features + 1, dtype=np.float64)  # float64: the count stays exact
        sums[:features] = x.sum(axis=axes)
        sums[features] = x.size // features
        self.mode.sum_over_ranks(sums)
        total = sums[features]  # the global batch's rows (float64: exact), left on the device
        self.count = xp.maximum(total, 1.0)
        mean = (sums[:features] / self.count).astype(x.dtype)
        centred = x - mean.reshape(self._shape(x))
        var = self.mode.sum_over_ranks((centred * centred).sum(axis=axes)) / self.count.astype(x.dtype)
        m, seen = self.momentum, total > 0  # no rows anywhere this step (an empty share): nothing to learn
        unbiased = (self.count / xp.maximum(1.0, self.count - 1)).astype(x.dtype)
        xp.copyto(self.running_mean, m * self.running_mean + (1 - m) * mean, where=seen)
        xp.copyto(self.running_var, m * self.running_var + (1 - m) * var * unbiased, where=seen)
        return mean, var

    def forward(self, x: Array, gamma: Array, beta: Array) -> Array:
        xp = B.array_module(x)
        shape = self._shape(x)
        mean, var = self._batch_statistics(x) if self.mode.training else (self.running_mean, self.running_var)
        self.inv_std = (1.0 / xp.sqrt(var + self.epsilon)).reshape(shape)
        self.xhat = (x - mean.reshape(shape)) * self.inv_std
        return gamma.reshape(shape) * self.xhat + beta.reshape(shape)

    def backward(self, g: Array) -> Sequence[Array]:
        x, gamma = self.inputs[0].value, self.inputs[1].value
        xp, axes, shape = B.array_module(x), self._axes(x), self._shape(x)
        dgamma, dbeta = (g * self.xhat).sum(axis=axes), g.sum(axis=axes)
        dxhat = g * gamma.reshape(shape)
        if not self.mode.training:
            return dxhat * self.inv_std, dgamma, dbeta
        # sum(dxhat) = gamma * sum(g) and sum(dxhat * xhat) = gamma * dgamma, over the global batch
        totals = self.mode.sum_over_ranks(xp.concatenate([dbeta, dgamma])) * xp.concatenate([gamma, gamma])
        features = x.shape[1]
        count = self.count.astype(x.dtype)
        mean_dxhat = (totals[:features] / count).reshape(shape)
        mean_dxhat_xhat = (totals[features:] / count).reshape(shape)
        dx = (dxhat - mean_dxhat - self.xhat * mean_dxhat_xhat) * self.inv_std
        return dx, dgamma, dbeta
