"""The optimizer section of the config: optimizers and their learning-rate schedules, discriminated
unions on `type` (re-exported by `schema`)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from .base import PositiveFloat, Strict, UnitFloat


class ScheduleBase(Strict):
    warmup_epochs: Annotated[float, Field(ge=0.0)] = 0.0


class ConstantSchedule(ScheduleBase):
    type: Literal["constant"]


class StepSchedule(ScheduleBase):
    type: Literal["step"]
    step_size: PositiveFloat = Field(description="epochs between decays")
    gamma: PositiveFloat = 0.1


class ExponentialSchedule(ScheduleBase):
    type: Literal["exponential"]
    gamma: PositiveFloat
    decay_epochs: PositiveFloat = 1.0


class CosineSchedule(ScheduleBase):
    type: Literal["cosine"]
    epochs: PositiveFloat | None = Field(None, description="length of the decay (default: training.epochs)")
    min_lr: Annotated[float, Field(ge=0.0)] = 0.0


Schedule = Annotated[Union[ConstantSchedule, StepSchedule, ExponentialSchedule, CosineSchedule],
                     Field(discriminator="type")]


class OptimizerBase(Strict):
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


Optimizer = Annotated[Union[SGDOptimizer, AdamOptimizer, AdamWOptimizer, AdagradOptimizer, RMSpropOptimizer,
                            LARSOptimizer, LAMBOptimizer], Field(discriminator="type")]
