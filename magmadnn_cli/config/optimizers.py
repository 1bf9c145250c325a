"""The optimizers' and learning-rate schedules' declarations (name, hyperparameters, defaults,
ranges): discriminated unions on `type` (re-exported by `schema`). A schedule is pure arithmetic, so
its declaration carries its math too; the optimizers' update rules are in `nn/optimizers.py`."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from .base import Declared, PositiveFloat, UnitFloat


class ScheduleBase(Declared):
    """A learning rate as a function of the (fractional) epoch t: epoch-based, so it means the same at
    any batch size or rank count. `warmup_epochs` ramps it linearly from 0 over the first epochs."""
    declarations: ClassVar[dict[str, type[Declared]]] = {}
    warmup_epochs: Annotated[float, Field(ge=0.0)] = 0.0

    def rate(self, lr: float, t: float, epochs: int) -> float:
        """The learning rate at epoch t of a run of `epochs` epochs, from the base rate `lr`."""
        decayed = self.decayed(lr, t, epochs)
        return decayed * min(1.0, t / self.warmup_epochs) if self.warmup_epochs > 0 else decayed

    def decayed(self, lr: float, t: float, epochs: int) -> float:
        raise NotImplementedError  # abstract: every schedule defines it


class ConstantSchedule(ScheduleBase):
    type: Literal["constant"]

    def decayed(self, lr: float, t: float, epochs: int) -> float:
        return lr


class StepSchedule(ScheduleBase):
    type: Literal["step"]
    step_size: PositiveFloat = Field(description="epochs between decays")
    gamma: PositiveFloat = 0.1

    def decayed(self, lr: float, t: float, epochs: int) -> float:
        """lr * gamma ** floor(t / step_size)."""
        return lr * self.gamma ** math.floor(t / self.step_size)


class ExponentialSchedule(ScheduleBase):
    type: Literal["exponential"]
    gamma: PositiveFloat
    decay_epochs: PositiveFloat = 1.0

    def decayed(self, lr: float, t: float, epochs: int) -> float:
        """lr * gamma ** (t / decay_epochs)."""
        return lr * self.gamma ** (t / self.decay_epochs)


class CosineSchedule(ScheduleBase):
    type: Literal["cosine"]
    epochs: PositiveFloat | None = Field(None, description="length of the decay (default: training.epochs)")
    min_lr: Annotated[float, Field(ge=0.0)] = 0.0

    def decayed(self, lr: float, t: float, epochs: int) -> float:
        """min_lr + (lr - min_lr) (1 + cos(pi min(t, E) / E)) / 2, E = `epochs` or the run's (Loshchilov & Hutter)."""
        length = self.epochs if self.epochs is not None else max(1, epochs)
        return self.min_lr + (lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(t, length) / length))


Schedule = ScheduleBase.union()


class OptimizerBase(Declared):
    declarations: ClassVar[dict[str, type[Declared]]] = {}
    learning_rate: PositiveFloat = 0.01
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    clip_norm: PositiveFloat | None = None
    schedule: Schedule | None = None


class SGDOptimizer(OptimizerBase):
    type: Literal["sgd"]
    momentum: UnitFloat = 0.0
    nesterov: bool = False

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> "SGDOptimizer":
        if self.nesterov and not self.momentum:
            raise ValueError("nesterov: true needs momentum > 0")
        return self


class AdamOptimizer(OptimizerBase):
    type: Literal["adam"]
    learning_rate: PositiveFloat = 0.001
    beta1: UnitFloat = 0.9
    beta2: UnitFloat = 0.999
    epsilon: PositiveFloat = 1e-8


class AdamWOptimizer(AdamOptimizer):
    type: Literal["adamw"]  # type: ignore[assignment]
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.01


class AdagradOptimizer(OptimizerBase):
    type: Literal["adagrad"]
    epsilon: PositiveFloat = 1e-8


class RMSpropOptimizer(OptimizerBase):
    type: Literal["rmsprop"]
    learning_rate: PositiveFloat = 0.001
    rho: UnitFloat = 0.9
    epsilon: PositiveFloat = 1e-8


class LARSOptimizer(OptimizerBase):
    """Momentum SGD whose step for each weight tensor is scaled by a trust ratio (You, Gitman & Ginsburg 2017)."""
    type: Literal["lars"]
    learning_rate: PositiveFloat = Field(1.0, description="the global rate; each tensor's is this x its trust ratio")
    momentum: UnitFloat = 0.9
    trust_coefficient: PositiveFloat = Field(0.001, description="eta: trust = eta ||w|| / (||g|| + weight_decay ||w||)")
    epsilon: Annotated[float, Field(ge=0.0)] = Field(0.0, description="added to the trust ratio's denominator")
    exclude_bias_and_norm: bool = Field(False, description="1-D tensors (biases, batchnorm) get plain momentum SGD, "
                                        "no weight decay (common practice; the paper adapts every layer)")


class LAMBOptimizer(OptimizerBase):
    """Adam with decoupled weight decay whose step for each tensor is scaled to ||w|| / ||step|| (You et al. 2019)."""
    type: Literal["lamb"]
    learning_rate: PositiveFloat = 0.001
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.01
    beta1: UnitFloat = 0.9
    beta2: UnitFloat = 0.999
    epsilon: PositiveFloat = 1e-6
    exclude_bias_and_norm: bool = Field(False, description="1-D tensors (biases, batchnorm) get plain Adam steps, "
                                        "no weight decay")


class AdamaxOptimizer(AdamOptimizer):
    """Adam with the infinity norm: torch.optim.Adamax (Kingma & Ba 2015, section 7.1); Adam's betas and epsilon."""
    type: Literal["adamax"]  # type: ignore[assignment]
    learning_rate: PositiveFloat = 0.002


Optimizer = OptimizerBase.union()
