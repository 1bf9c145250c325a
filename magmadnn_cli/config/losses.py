"""The losses' declarations: name, hyperparameters and facts (`task`: what the targets are;
`fuses`: the output activation the loss takes over, consuming the logits). The runtime losses in
`nn/losses.py` take these validated objects."""

from __future__ import annotations

from typing import ClassVar, Literal

from .base import Declared, PositiveFloat

class LossSpec(Declared):
    declarations: ClassVar[dict[str, type[Declared]]] = {}
    task: ClassVar[str] = "regression"     # classification | binary | regression
    fuses: ClassVar[str | None] = None      # the output activation folded into this loss


class CrossEntropyLoss(LossSpec):
    type: Literal["cross_entropy"]
    task: ClassVar[str] = "classification"
    fuses: ClassVar[str | None] = "softmax"


class BinaryCrossEntropyLoss(LossSpec):
    type: Literal["binary_cross_entropy"]
    task: ClassVar[str] = "binary"
    fuses: ClassVar[str | None] = "sigmoid"


class MSELoss(LossSpec):
    type: Literal["mse"]


class MAELoss(LossSpec):
    type: Literal["mae"]


class HuberLoss(LossSpec):
    """Mean over all elements of 0.5 d^2 where |d| < delta, else delta (|d| - delta / 2): torch.nn.HuberLoss."""
    type: Literal["huber"]
    delta: PositiveFloat = 1.0


Loss = LossSpec.union()
