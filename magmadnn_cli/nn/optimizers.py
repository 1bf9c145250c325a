"""Optimizers, each implementing one declaration of `config/optimizers.py` (name, hyperparameters,
defaults, ranges, schedule); the registry `OPTIMIZERS` is built from them. The base class owns the
step (schedule, clipping, L2 decay); a subclass writes only its update rule on the flat parameter and
gradient buffers, in place.
Layer-wise rules (LARS, LAMB) also need each parameter tensor's extent in the flat buffers: `set_segments`."""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from ..config import optimizers as decl
from ..core import backend as B
from ..core import blas
from ..core.graph.kernels import elementwise

Array = Any
CPU_CHUNK = 65536  # elements per chunk of an update on the CPU (256 KiB of float32)


class Optimizer:
    """A runtime optimizer takes its validated declaration, whose hyperparameters become attributes
    (`self.learning_rate`, `self.beta1`, ...); `epochs` is the run's length (a cosine schedule's default)."""
    declaration: ClassVar[type[decl.OptimizerBase]]
    implementations: ClassVar[dict[str, type["Optimizer"]]] = {}
    slots: ClassVar[tuple[str, ...]] = ()    # per-parameter state buffers, same shape as the parameters
    scalars: ClassVar[tuple[str, ...]] = ()  # other attributes that change as it trains (saved too)
    learning_rate: float
    weight_decay: float
    clip_norm: float | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "declaration" in cls.__dict__:
            tag = cls.declaration.tag()
            if tag in Optimizer.implementations:
                raise TypeError(f"{cls.__name__} implements {tag!r}, already implemented by "
                                f"{Optimizer.implementations[tag]}")
            Optimizer.implementations[tag] = cls

    def __init__(self, declared: decl.OptimizerBase, steps_per_epoch: int = 1, epochs: int = 1) -> None:
        self.spec, self.name = declared, declared.type
        for field in type(declared).model_fields:
            if field not in ("type", "schedule"):
                setattr(self, field, getattr(declared, field))
        self.epochs = epochs
        self.steps_per_epoch = max(1, steps_per_epoch)
        self.epoch_of_step: Callable[[int], float] | None = None  # epochs done after t steps, when not t / steps_per_epoch
        self.t = 0  # steps taken
        self.state: dict[str, Array] = {}
        self._scratch: Array | None = None  # a chunk-sized buffer for temporaries
        self.shapes: list[tuple[int, ...]] | None = None  # the parameter tensors in flat order (set_segments)

    @classmethod
    def of(cls, steps_per_epoch: int = 1, epochs: int = 1, **hyperparameters: Any) -> "Optimizer":
        """The optimizer from hyperparameters, validated by its declaration (`Adam.of(learning_rate=0.01)`)."""
        return cls(cls.declaration.of(**hyperparameters), steps_per_epoch, epochs)

    def schedule(self, epoch: float) -> float:
        """The learning rate at this (fractional) epoch: the declared schedule of `learning_rate`."""
        if self.spec.schedule is None:
            return self.learning_rate
        return self.spec.schedule.rate(self.learning_rate, epoch, self.epochs)

    def set_segments(self, shapes: Sequence[Sequence[int]]) -> None:
        """The shapes of the parameter tensors, in the order the flat buffers hold them
        (`Network.parameter_shapes`). Layer-wise rules take their norms per tensor; until this is
        called the whole buffer counts as one tensor."""
        self.shapes = [tuple(int(n) for n in shape) for shape in shapes]

    def lr(self) -> float:
        """The learning rate of the step about to be taken."""
        return self.schedule(self.epoch_of_step(self.t) if self.epoch_of_step else self.t / self.steps_per_epoch)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The step count, every slot (host copies) and every attribute named in `scalars`."""
        state: dict[str, Any] = {"step": self.t, **{name: getattr(self, name) for name in self.scalars}}
        state.update({f"slots/{k}": B.to_host(v).copy() for k, v in self.state.items()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s result; slots are copied in place where they exist (they may
        live in memory that data-parallel ranks share)."""
        self.t = int(state["step"])
        for name in self.scalars:
            setattr(self, name, type(getattr(self, name))(state[name]))
        for key, value in state.items():
            if key.startswith("slots/"):
                name = key.removeprefix("slots/")
                if name in self.state:
                    self.state[name][...] = B.to_device(value, dtype=self.state[name].dtype)
                else:
                    self.state[name] = B.to_device(value, dtype=B.current().floatx)

    def ensure_state(self, params: Array) -> None:
        """Create the slots (zeros, like `params`) before the first update."""
        if not self.state and self.slots:
            xp = B.array_module(params)
            self.state = {s: xp.zeros_like(params) for s in self.slots}

    # -- one step ------------------------------------------------------------------------------
    def step(self, params: Array, grads: Array) -> None:
        """One update of `params` from `grads` (both flat; `grads` is used as scratch): clip the
        gradient to `clip_norm`, then apply the rule."""
        self.ensure_state(params)
        if self.clip_norm is not None:
            self.clip(grads, float(B.array_module(grads).vdot(grads, grads)))
        self.apply(params, grads, self.state)

    def clip(self, grads: Array, squared_norm: float) -> None:
        """Scale `grads` in place so that the whole gradient, whose squared norm is given (it may be
        summed over more than `grads`), has norm at most `clip_norm`."""
        norm = math.sqrt(squared_norm)
        if self.clip_norm is not None and norm > self.clip_norm:
            grads *= self.clip_norm / norm

    def apply(self, params: Array, grads: Array, slots: dict[str, Array], start: int = 0,
              total: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """Take this step's learning rate, then run the rule on `params`, `grads` and `slots` (views
        of the same elements: the whole buffers, or any part of them) in place.

        When several ranks each update a part, `start` is where this part begins in the whole buffer
        and `total` sums an array over those ranks (an allreduce); only layer-wise rules need them.
        On the CPU the buffers are walked in cache-sized chunks, so the few elementwise passes of a
        rule run on data still in cache (measured in docs/performance.md, "Why the code is shaped so")."""
        chunk = self._chunk(params)
        lr = self.lr()
        self.t += 1
        for offset in range(0, params.size, chunk):
            part = slice(offset, min(offset + chunk, params.size))
            p, g = params[part], grads[part]
            self.decay(p, g, lr)
            self.update(p, g, lr, {k: v[part] for k, v in slots.items()})

    def _chunk(self, params: Array) -> int:
        """Elements per chunk (cache-sized on the CPU, everything on the GPU), with scratch for one."""
        xp = B.array_module(params)
        chunk = CPU_CHUNK if xp is np else max(1, params.size)
        if self._scratch is None or self._scratch.size < min(chunk, params.size):
            self._scratch = xp.empty(min(chunk, params.size), dtype=params.dtype)
        return chunk

    def decay(self, params: Array, grads: Array, lr: float) -> None:
        """L2 weight decay, coupled: g <- g + wd * p."""
        if self.weight_decay:
            tmp = self._scratch[:params.size]
            B.array_module(params).multiply(params, self.weight_decay, out=tmp)
            grads += tmp

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        """The rule, in place on `p`; `state` holds this chunk's view of each slot."""
        raise NotImplementedError  # abstract: every optimizer defines its rule


class SGD(Optimizer):
    """Plain:    p <- p - lr g
    Momentum: v <- mu v + g;  p <- p - lr v
    Nesterov: v <- mu v + g;  p <- p - lr (g + mu v)        (PyTorch's formulation)"""
    declaration = decl.SGDOptimizer
    momentum: float
    nesterov: bool

    def __init__(self, declared: decl.SGDOptimizer, steps_per_epoch: int = 1, epochs: int = 1) -> None:
        super().__init__(declared, steps_per_epoch, epochs)
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
            elementwise("sgd_decay_step")(grads, params.dtype.type(lr),
                                          params.dtype.type(1.0 - lr * self.weight_decay), params)

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


class Adam(Optimizer):
    """m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;
    p <- p - lr * m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps)        (Kingma & Ba 2015)"""
    declaration = decl.AdamOptimizer
    slots = ("m", "v")
    beta1: float
    beta2: float
    epsilon: float

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        xp = B.array_module(p)
        m, v = state["m"], state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        m_hat_scale = 1.0 / (1 - self.beta1 ** self.t)
        v_hat = v * (1.0 / (1 - self.beta2 ** self.t))
        p -= (lr * m_hat_scale) * m / (xp.sqrt(v_hat) + self.epsilon)


class AdamW(Adam):
    """Adam with decoupled weight decay: p <- p - lr wd p, then the Adam step (Loshchilov & Hutter 2019)."""
    declaration = decl.AdamWOptimizer

    def decay(self, params: Array, grads: Array, lr: float) -> None:
        if self.weight_decay:
            params -= (lr * self.weight_decay) * params


class Adagrad(Optimizer):
    """G <- G + g^2;  p <- p - lr g / (sqrt(G) + eps)        (Duchi et al. 2011)"""
    declaration = decl.AdagradOptimizer
    slots = ("accumulator",)
    epsilon: float

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

    def __init__(self, declared: decl.LARSOptimizer | decl.LAMBOptimizer, steps_per_epoch: int = 1,
                 epochs: int = 1) -> None:
        super().__init__(declared, steps_per_epoch, epochs)
        self._pieces: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}

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
        norms = np.zeros((len(excluded), 2))
        if measured:  # one transfer from the GPU for all of them
            np.add.at(norms, [s for s, _, _ in pieces], B.to_host(xp.stack(measured)).reshape(-1, 2))
        norms = np.sqrt(total(norms) if total is not None else norms)
        ratios = np.where(excluded, 1.0, self.ratio(norms[:, 0], norms[:, 1], decay))
        for (s, _, _), (p, g, state) in zip(pieces, parts):
            self.update(p, g, lr * float(ratios[s]), state)

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

    def __init__(self, declared: decl.LARSOptimizer, steps_per_epoch: int = 1, epochs: int = 1) -> None:
        super().__init__(declared, steps_per_epoch, epochs)
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
        return np.where((w > 0) & (u > 0), trust, 1.0)

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
            return np.where((w > 0) & (u > 0), w / u, 1.0)

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

    def update(self, p: Array, g: Array, lr: float, state: dict[str, Array]) -> None:
        xp = B.array_module(p)
        m, u = state["m"], state["u"]
        m *= self.beta1
        m += (1 - self.beta1) * g
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

