"""Losses, each implementing one declaration of `config/losses.py` (its name, hyperparameters, task
and fused activation); the registry `LOSSES` (config name -> loss) is built from them.

A loss whose declaration `fuses` the network's output activation consumes the pre-activation
(logits), so softmax + cross-entropy and sigmoid + binary cross-entropy are single stable nodes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from ..config import losses as decl
from ..core import backend as B
from ..core.graph import Node, Op, nn
from ..core.registry import Registered


class Loss(Registered):
    """A runtime loss takes its validated declaration (default: the declared defaults)."""
    declaration: ClassVar[type[decl.LossSpec]]
    implementations: ClassVar[dict[str, type["Loss"]]] = {}

    def __init__(self, declared: decl.LossSpec | None = None) -> None:
        self.spec = declared if declared is not None else self.declaration.of()
        self.name = self.spec.type

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        raise NotImplementedError  # abstract


class CrossEntropy(Loss):
    declaration = decl.CrossEntropyLoss

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.SoftmaxCrossEntropy(prediction, target)


class BinaryCrossEntropy(Loss):
    declaration = decl.BinaryCrossEntropyLoss

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.BinaryCrossEntropy(prediction, target, from_logits=fused)


class MeanSquaredError(Loss):
    declaration = decl.MSELoss

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.MeanSquaredError(prediction, target)


class MeanAbsoluteError(Loss):
    declaration = decl.MAELoss

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.MeanAbsoluteError(prediction, target)


class Huber(Loss):
    declaration = decl.HuberLoss

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return HuberNode(prediction, target, self.spec.delta)


class HuberNode(Op):
    """mean over all elements of 0.5 d^2 (|d| <= delta) or delta (|d| - delta / 2), d = pred - y;
    gradient clip(d, -delta, delta) / N (the two pieces agree at |d| = delta)."""

    def __init__(self, pred: Node, target: Node, delta: float) -> None:
        super().__init__(pred, target, name="huber")
        self.delta = delta

    def forward(self, p: Any, y: Any) -> Any:
        xp = B.array_module(p)
        self.diff = p - y
        size = xp.abs(self.diff)
        rows = xp.where(size <= self.delta, 0.5 * self.diff * self.diff, self.delta * (size - 0.5 * self.delta))
        return rows.sum() / max(self.diff.size, 1)

    def backward(self, g: Any) -> Sequence[Any]:
        xp = B.array_module(self.diff)
        return xp.clip(self.diff, -self.delta, self.delta) * (g / max(self.diff.size, 1)), None


LOSSES = Loss.implementations
