"""Optimizers, each implementing one declaration of `config/optimizers.py` (name, hyperparameters,
defaults, ranges, schedule) with its update rule; the registry `OPTIMIZERS` is built from them. The
contract they follow (schedule, clipping, decay, state) is in `optimizer_base`."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..config import optimizers as decl
from ..core import backend as B
from ..core import blas
from ..core.graph.kernels import elementwise

from .optimizer_base import CPU_CHUNK, Array, Optimizer

__all__ = ["CPU_CHUNK", "OPTIMIZERS", "Optimizer", "minimize"]


class SGD(Optimizer):
    """Plain:    p <- p - lr g
    Momentum: v <- mu v + g;  p <- p - lr v
    Nesterov: v <- mu v + g;  p <- p - lr (g + mu v)        (PyTorch's formulation)"""
    declaration = decl.SGDOptimizer
    momentum: float
    nesterov: bool

    def __init__(self, declared: decl.SGDOptimizer, *schedule: Any, **named: Any) -> None:
        super().__init__(declared, *schedule, **named)
        self.slots = ("velocity",) if self.momentum else ()

    def decay(self, params: Array, grads: Array, lr: float) -> None:
        """Without momentum, p - lr (g + wd p) = (1 - lr wd) p - lr g: one pass instead of two."""
        if self.weight_decay and not self.momentum:
            params *= 1.0 - lr * self.weight_decay
        else:
            super().decay(params, grads, lr)

    def apply(self, params: Array, grads: Array, slots: dict[str, Array], start: int = 0,
              total: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """Plain SGD is p <- (1 - lr wd) p - lr g: one fused pass (a cupy kernel on the GPU, BLAS
        axpby on the CPU) instead of three."""
        own_rule = type(self).update is not SGD.update or type(self).decay is not SGD.decay  # a subclass's
        if own_rule or self.momentum or not blas.can_axpby(params):
            super().apply(params, grads, slots, start, total)
            return
        lr = self.lr()
        self.t += 1
        if B.array_module(params) is np:
            blas.axpby(-lr, grads, 1.0 - lr * self.weight_decay, params)
        else:
            elementwise("sgd_decay_step")(grads, params.dtype.type(lr), params.dtype.type(1.0 - lr * self.weight_decay),
                                          B.array_module(params).ones((), dtype=bool), params)

    def fused(self, lr: Any, t: Any) -> tuple[str, tuple[Any, ...]]:
        if self.momentum:
            return "momentum_step", (lr, self.weight_decay, self.momentum, self.nesterov)
        return "sgd_decay_step", (lr, 1.0 - lr * self.weight_decay)

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        if self.momentum:
            v = state["velocity"]
            v *= self.momentum
            v += g
            if self.nesterov:
                g += self.momentum * v
            else:
                g[...] = v
        g *= lr
        p -= g


def _average_in(average: Array, value: Array, beta: float) -> None:
    """average <- beta average + (1 - beta) value, in place (an exponential moving average)."""
    average *= beta
    average += (1 - beta) * value


class Adam(Optimizer):
    """m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;
    p <- p - lr * m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps)        (Kingma & Ba 2015)"""
    declaration = decl.AdamOptimizer
    slots = ("m", "v")
    beta1: float
    beta2: float
    epsilon: float

    def fused(self, lr: Any, t: Any) -> tuple[str, tuple[Any, ...]]:
        b1, b2 = self.beta1, self.beta2
        return "adam_step", (lr / (1 - b1 ** t), 1.0 / (1 - b2 ** t), b1, b2, self.epsilon, self.weight_decay, 0.0)

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        xp = B.array_module(p)
        m, v = state["m"], state["v"]
        _average_in(m, g, self.beta1)
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        m_hat_scale = 1.0 / (1 - self.beta1 ** self.t)
        v_hat = v * (1.0 / (1 - self.beta2 ** self.t))
        p -= (lr * m_hat_scale) * m / (xp.sqrt(v_hat) + self.epsilon)


class AdamW(Adam):
    """Adam with decoupled weight decay: p <- p - lr wd p, then the Adam step (Loshchilov & Hutter 2019)."""
    declaration = decl.AdamWOptimizer

    def fused(self, lr: Any, t: Any) -> tuple[str, tuple[Any, ...]]:
        b1, b2 = self.beta1, self.beta2
        return "adam_step", (lr / (1 - b1 ** t), 1.0 / (1 - b2 ** t), b1, b2, self.epsilon, 0.0, lr * self.weight_decay)

    def decay(self, params: Array, grads: Array, lr: float) -> None:
        if self.weight_decay:
            params -= (lr * self.weight_decay) * params


class Adagrad(Optimizer):
    """G <- G + g^2;  p <- p - lr g / (sqrt(G) + eps)        (Duchi et al. 2011)"""
    declaration = decl.AdagradOptimizer
    slots = ("accumulator",)
    epsilon: float

    def fused(self, lr: Any, t: Any) -> tuple[str, tuple[Any, ...]]:
        return "square_step", (lr, 1.0, 1.0, self.epsilon, self.weight_decay)

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        acc = state["accumulator"]
        acc += g * g
        p -= lr * g / (B.array_module(p).sqrt(acc) + self.epsilon)


class RMSprop(Optimizer):
    """s <- rho s + (1-rho) g^2;  p <- p - lr g / (sqrt(s) + eps)        (Hinton, lecture 6e)"""
    declaration = decl.RMSpropOptimizer
    slots = ("square_avg",)
    rho: float
    epsilon: float

    def fused(self, lr: Any, t: Any) -> tuple[str, tuple[Any, ...]]:
        return "square_step", (lr, self.rho, 1 - self.rho, self.epsilon, self.weight_decay)

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        s = state["square_avg"]
        s *= self.rho
        s += (1 - self.rho) * g * g
        p -= lr * g / (B.array_module(p).sqrt(s) + self.epsilon)


class LayerWise(Optimizer):
    """The base of layer-wise rules: each parameter tensor's step is scaled by a ratio of norms over
    that whole tensor. Two passes over pieces of the buffers that each lie in one tensor and one
    chunk: `measure` turns a piece's gradient into its step direction (in place) and returns the
    piece's squared norms; summed per tensor (and over the ranks sharing the update, by `total`) they
    give each tensor's `ratio`; `update` then steps every piece at lr x its tensor's ratio.
    `exclude_bias_and_norm`: 1-D tensors (biases, batchnorm scales and shifts) get ratio 1 and no
    weight decay."""

    exclude_bias_and_norm: bool

    def __init__(self, declared: decl.LARSOptimizer | decl.LAMBOptimizer, *schedule: Any, **named: Any) -> None:
        super().__init__(declared, *schedule, **named)
        self._pieces: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
        self._on_device: dict[tuple, tuple[Array, Array, Array]] = {}  # _device_ratios' constants

    def set_segments(self, shapes: Sequence[Sequence[int]]) -> None:
        super().set_segments(shapes)
        self._pieces = {}  # (start, size, chunk) -> pieces

    def apply(self, params: Array, grads: Array, slots: dict[str, Array], start: int = 0,
              total: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        xp, chunk = B.array_module(params), self._chunk(params)
        lr = self.lr()
        self.t += 1
        pieces = self.pieces(start, params.size, chunk, whole=total is None)
        excluded = np.array([self.exclude_bias_and_norm and len(s) <= 1 for s in self.shapes or [()]])
        decay = np.where(excluded, 0.0, self.weight_decay)
        parts = [(params[a:b], grads[a:b], {k: v[a:b] for k, v in slots.items()}) for _, a, b in pieces]
        measured = [x for (s, _, _), part in zip(pieces, parts) for x in self.measure(*part, float(decay[s]))]
        if xp is np or total is not None:
            ratios = self._host_ratios(pieces, measured, excluded, decay, total, xp)
            steps = [lr * float(ratios[s]) for s, _, _ in pieces]
        else:  # on the device: nothing read back
            ratios = self._device_ratios(pieces, measured, excluded, decay, xp)
            steps = [(lr * ratios[s]).astype(params.dtype) for s, _, _ in pieces]
        for step, (p, g, state) in zip(steps, parts):
            self.update(p, g, step, state)

    def _host_ratios(self, pieces: list[tuple[int, int, int]], measured: list[Array], excluded: np.ndarray,
                     decay: np.ndarray, total: Callable[[np.ndarray], np.ndarray] | None, xp: Any) -> np.ndarray:
        """Each tensor's ratio on the host: the pieces' squared norms in one transfer, summed per tensor
        (and over the ranks sharing the update)."""
        norms = np.zeros((len(excluded), 2))
        if measured:  # one transfer from the GPU for all of them
            np.add.at(norms, [s for s, _, _ in pieces], B.to_host(xp.stack(measured)).reshape(-1, 2))
        norms = np.sqrt(total(norms) if total is not None else norms)
        return np.where(excluded, 1.0, self.ratio(norms[:, 0], norms[:, 1], decay))

    def _device_ratios(self, pieces: list[tuple[int, int, int]], measured: list[Array], excluded: np.ndarray,
                       decay: np.ndarray, xp: Any) -> Array:
        """Each tensor's ratio on the device: the pieces' squared norms summed per tensor by a 0/1
        matrix (tensors x pieces), with the constants copied to the device once."""
        key = tuple(pieces)
        if key not in self._on_device:
            member = np.zeros((len(excluded), len(pieces)))
            member[[s for s, _, _ in pieces], np.arange(len(pieces))] = 1.0
            self._on_device = {key: (xp.asarray(member), xp.asarray(excluded), xp.asarray(decay))}
        member, excluded_d, decay_d = self._on_device[key]
        norms = xp.sqrt(member @ xp.stack(measured).reshape(-1, 2).astype(np.float64))
        return xp.where(excluded_d, 1.0, self.ratio(norms[:, 0], norms[:, 1], decay_d))

    def pieces(self, start: int, size: int, chunk: int, whole: bool) -> list[tuple[int, int, int]]:
        """(tensor, lo, hi) for each piece of the part [start, start + size) of the buffers that lies in
        one tensor and one chunk, lo and hi counted from `start`; `whole`: the part must be everything."""
        if (start, size, chunk) not in self._pieces:
            sizes = [math.prod(s) for s in self.shapes] if self.shapes is not None else [start + size]
            bounds = np.cumsum([0, *sizes]).tolist()
            if start + size > bounds[-1] or (whole and (start, size) != (0, bounds[-1])):
                raise ValueError(f"set_segments gave parameter tensors of {bounds[-1]} elements in all, but the "
                                 f"update was given elements {start} to {start + size}: pass the network's "
                                 "parameter_shapes, in flat order")
            found = []
            for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
                lo, hi = max(lo, start), min(hi, start + size)
                found += [(s, a - start, min(a + chunk, hi) - start) for a in range(lo, hi, chunk)]
            self._pieces[(start, size, chunk)] = found
        return self._pieces[(start, size, chunk)]

    def measure(self, p: Array, g: Array, state: dict[str, Array], decay: float) -> tuple[Array, Array]:
        """Pass 1 on a piece of one tensor: leave the step direction in `g` and return the squared
        norms (of the weights, of what the ratio divides by) of this piece."""
        raise NotImplementedError  # abstract: every layer-wise rule defines it

    def ratio(self, w: np.ndarray, u: np.ndarray, decay: np.ndarray) -> np.ndarray:
        """Each tensor's ratio from its weights' norm `w` and the other norm `u` (arrays over tensors)."""
        raise NotImplementedError  # abstract: every layer-wise rule defines it


class LARS(LayerWise):
    """Layer-wise adaptive rate scaling (You, Gitman & Ginsburg 2017, Algorithm 1 and eq. 6), per tensor l:
        trust_l = eta ||w_l|| / (||g_l|| + wd ||w_l|| + eps)      (1 where ||w_l|| or ||g_l|| is 0)
        v <- mu v + lr trust_l (g + wd w);   w <- w - v
    eta is `trust_coefficient`; eps (default 0, as in TensorFlow's LARSOptimizer) only guards the
    denominator. The paper adapts every layer; `exclude_bias_and_norm` gives 1-D tensors trust 1 and
    no weight decay, as SimCLR's LARS does for its biases and batchnorm variables."""
    declaration = decl.LARSOptimizer
    momentum: float
    trust_coefficient: float
    epsilon: float

    def __init__(self, declared: decl.LARSOptimizer, *schedule: Any, **named: Any) -> None:
        super().__init__(declared, *schedule, **named)
        self.slots = ("velocity",) if self.momentum else ()

    def measure(self, p: Array, g: Array, state: dict[str, Array], decay: float) -> tuple[Array, Array]:
        xp = B.array_module(p)
        norms = xp.vdot(p, p), xp.vdot(g, g)
        if decay:
            tmp = self._scratch[:p.size]
            xp.multiply(p, decay, out=tmp)
            g += tmp
        return norms

    def ratio(self, w: np.ndarray, u: np.ndarray, decay: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            trust = self.trust_coefficient * w / (u + decay * w + self.epsilon)
        return B.array_module(w).where((w > 0) & (u > 0), trust, 1.0)

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        g *= lr
        if self.momentum:
            v = state["velocity"]
            v *= self.momentum
            v += g
            g = v
        p -= g


class LAMB(LayerWise):
    """Layer-wise adaptive moments (You et al. 2019, Algorithm 2 with phi = identity), per tensor l:
        m <- b1 m + (1-b1) g;   v <- b2 v + (1-b2) g^2
        r = m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd w          (weight decay decoupled, as in AdamW)
        w <- w - lr (||w_l|| / ||r_l||) r                          (ratio 1 where either norm is 0)"""
    declaration = decl.LAMBOptimizer
    slots = ("m", "v")
    beta1: float
    beta2: float
    epsilon: float

    def measure(self, p: Array, g: Array, state: dict[str, Array], decay: float) -> tuple[Array, Array]:
        xp, tmp = B.array_module(p), self._scratch[:p.size]
        m, v = state["m"], state["v"]
        m *= self.beta1
        m += xp.multiply(g, 1 - self.beta1, out=tmp)
        v *= self.beta2
        v += xp.multiply(xp.multiply(g, g, out=tmp), 1 - self.beta2, out=tmp)
        xp.sqrt(xp.multiply(v, 1.0 / (1 - self.beta2 ** self.t), out=tmp), out=tmp)
        tmp += self.epsilon
        xp.multiply(m, 1.0 / (1 - self.beta1 ** self.t), out=g)
        g /= tmp
        if decay:
            g += xp.multiply(p, decay, out=tmp)
        return xp.vdot(p, p), xp.vdot(g, g)

    def ratio(self, w: np.ndarray, u: np.ndarray, decay: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return B.array_module(w).where((w > 0) & (u > 0), w / u, 1.0)

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        g *= lr
        p -= g


class Adamax(Optimizer):
    """m <- b1 m + (1-b1) g;  u <- max(b2 u, |g| + eps);  p <- p - lr/(1-b1^t) m/u
    (Kingma & Ba 2015, section 7.1, with torch.optim.Adamax's eps inside the max)"""
    declaration = decl.AdamaxOptimizer
    slots = ("m", "u")
    beta1: float
    beta2: float
    epsilon: float

    def fused(self, lr: Any, t: Any) -> tuple[str, tuple[Any, ...]]:
        return "adamax_step", (lr / (1 - self.beta1 ** t), self.beta1, self.beta2, self.epsilon, self.weight_decay)

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        xp = B.array_module(p)
        m, u = state["m"], state["u"]
        _average_in(m, g, self.beta1)
        u *= self.beta2
        xp.maximum(u, xp.abs(g) + self.epsilon, out=u)
        p -= (lr / (1 - self.beta1 ** self.t)) * m / u


OPTIMIZERS = Optimizer.implementations


def minimize(loss_graph: Any, optimizer: Optimizer, steps: int, wrt: list[Any]) -> float:
    """Minimize a scalar graph over free variables (MagmaDNN's `opt.minimize(expr, wrt=[x])`)."""
    xp = B.current().xp
    flat_p = xp.concatenate([v.value.ravel() for v in wrt])
    optimizer.set_segments([v.value.shape for v in wrt])
    loss = float("nan")
    for _ in range(steps):
        (value,) = loss_graph.forward()
        loss = float(value)
        loss_graph.backward()
        flat_g = xp.concatenate([(v.grad if v.grad is not None else xp.zeros_like(v.value)).ravel() for v in wrt])
        optimizer.step(flat_p, flat_g)
        offset = 0
        for v in wrt:
            v.value = flat_p[offset:offset + v.value.size].reshape(v.value.shape).copy()
            offset += v.value.size
    return loss

