"""The optimizer contract every optimizer follows: `__init__` takes the optimizer's validated
declaration (`config/optimizers.py`), whose hyperparameters become attributes; the base class owns the
step (schedule, clipping, coupled L2 decay, the step count, chunking, state); a subclass writes only its
update rule on the flat parameter and gradient buffers, in place. Layer-wise rules also need each
parameter tensor's extent in the flat buffers: `set_segments`."""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from ..config import optimizers as decl
from ..core import backend as B
from ..core.graph.kernels import elementwise
from ..core.registry import Registered

Array = Any
CPU_CHUNK = 65536  # elements per chunk of an update on the CPU (256 KiB of float32)


class Optimizer(Registered):
    """A runtime optimizer takes its validated declaration, whose hyperparameters become attributes
    (`self.learning_rate`, `self.beta1`, ...); `epochs` is the run's length (a cosine schedule's default)."""
    declaration: ClassVar[type[decl.OptimizerBase]]
    implementations: ClassVar[dict[str, type["Optimizer"]]] = {}
    slots: ClassVar[tuple[str, ...]] = ()    # per-parameter state buffers, same shape as the parameters
    scalars: ClassVar[tuple[str, ...]] = ()  # other attributes that change as it trains (saved too)
    learning_rate: float
    weight_decay: float
    clip_norm: float | None

    def __init__(self, declared: decl.OptimizerBase, steps_per_epoch: int = 1, epochs: int = 1,
                 epoch_of_step: Callable[[int], float] | None = None,
                 sweep: Callable[[int], float] | None = None) -> None:
        self.spec, self.name = declared, declared.type
        for field in type(declared).model_fields:
            if field not in ("type", "schedule"):
                setattr(self, field, getattr(declared, field))
        self.epochs = epochs
        self.steps_per_epoch = max(1, steps_per_epoch)
        self.epoch_of_step = epoch_of_step  # epochs done after t steps, when not t / steps_per_epoch (a batch schedule)
        self.sweep = sweep  # the t-th step's rate in place of the schedule (lr-find's range test)
        self.t = 0  # steps taken
        self.state: dict[str, Array] = {}
        self._scratch: Array | None = None  # a chunk-sized buffer for temporaries
        self.shapes: list[tuple[int, ...]] | None = None  # the parameter tensors in flat order (set_segments)
        self.device_scalars: Array | None = None  # on a GPU: the step's learning rate and count (begin_step)

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
        if self.sweep is not None:
            return self.sweep(self.t)
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
    def step(self, params: Array, grads: Array, finite: Any = True) -> None:
        """One update of `params` from `grads` (both flat; `grads` is used as scratch): clip the
        gradient to `clip_norm`, then apply the rule. None unless `finite` (the step's loss, and under
        loss scaling its gradients, were): on the CPU a host branch; on a GPU the device keeps the old
        values, so nothing is read back. A skipped step still counts (the step count and the schedule
        advance) on every device: a GPU could not know it was skipped without a read."""
        xp = B.array_module(params)
        if xp is np and not finite:
            self.t += 1
            return
        if xp is not np and self.fusable():  # eagerly: the rate and count as kernel arguments
            lr = self.lr()
            self.t += 1
            self._fused_update(params, grads, finite, lr, self.t)
            return
        self.ensure_state(params)
        if self.clip_norm is not None:
            squared = xp.vdot(grads, grads)
            self.clip(grads, float(squared) if xp is np else squared)
        if xp is np or finite is True:
            self.apply(params, grads, self.state)
        else:
            self._apply_if(finite, params, grads)

    def fused(self, lr: Any, t: Any) -> tuple[str, tuple[Any, ...]] | None:
        """On a GPU: the kernel that takes the whole step in one pass (`core/graph/kernels.py`) and its
        scalar arguments after the gradient, from the learning rate and the step count (advanced), which
        are device scalars; None: no such kernel."""
        return None

    def fusable(self) -> bool:
        """Whether `fused` describes this class's rule (a subclass with its own rule or decay has none);
        on a GPU, such a step can be captured (`begin_step`, then `device_step`)."""
        mro = type(self).__mro__
        owner = {name: next(i for i, c in enumerate(mro) if name in c.__dict__) for name in ("fused", "update", "decay")}
        return owner["fused"] < len(mro) - 2 and owner["fused"] <= min(owner["update"], owner["decay"])

    def begin_step(self) -> None:
        """On the host, before a GPU step: the step's learning rate (its schedule) and the advanced step
        count, written to device memory where the update reads them (a fill, neither a copy nor a wait:
        outside a captured step, as PyTorch's capturable optimizers take theirs)."""
        lr = self.lr()
        self.t += 1
        if self.device_scalars is None:
            self.device_scalars = B.current().xp.zeros(2, dtype=np.float64)
        self.device_scalars[0] = lr
        self.device_scalars[1] = float(self.t)

    def device_step(self, params: Array, grads: Array, finite: Any = True) -> None:
        """The update on the device after `begin_step`, reading the rate and count from device memory:
        host values here are constants, so a captured step replays it as it is."""
        assert self.device_scalars is not None, "begin_step comes first"
        self._fused_update(params, grads, finite, self.device_scalars[0], self.device_scalars[1])

    def _fused_update(self, params: Array, grads: Array, finite: Any, lr: Any, t: Any) -> None:
        """Clipping, then one kernel over the parameters, gradients and slots, skipped by the kernel
        unless `finite` (a device boolean); `lr` and `t`: host numbers or device scalars."""
        xp, kind = B.array_module(params), params.dtype.type
        self.ensure_state(params)
        if self.clip_norm is not None:
            self.clip(grads, xp.vdot(grads, grads))
        found = self.fused(lr, t)
        assert found is not None
        name, scalars = found
        ok = xp.ones((), dtype=bool) if finite is True else finite
        values = [np.bool_(v) if isinstance(v, bool) else v.astype(kind) if hasattr(v, "astype") else kind(v)
                  for v in scalars]
        elementwise(name)(grads, *values, ok, params, *(self.state[s] for s in self.slots))

    def _apply_if(self, finite: Array, params: Array, grads: Array) -> None:
        """Apply the rule, then put the old parameters and slots back where `finite` is false (device
        arrays: the choice is made on the device)."""
        xp = B.array_module(params)
        targets = [params, *self.state.values()]
        kept = [t.copy() for t in targets]
        self.apply(params, grads, self.state)
        for target, old in zip(targets, kept):
            xp.copyto(target, old, where=~finite)

    def clip(self, grads: Array, squared_norm: Any) -> None:
        """Scale `grads` in place so that the whole gradient, whose squared norm is given (it may be
        summed over more than `grads`; a host float, or a device scalar kept on the device), has norm
        at most `clip_norm`."""
        if self.clip_norm is None:
            return
        if isinstance(squared_norm, float):
            norm = math.sqrt(squared_norm)
            if norm > self.clip_norm:
                grads *= self.clip_norm / norm
            return
        xp = B.array_module(grads)
        norm = xp.sqrt(squared_norm.astype(np.float64))
        grads *= xp.where(norm > self.clip_norm, self.clip_norm / norm, 1.0).astype(grads.dtype)

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
