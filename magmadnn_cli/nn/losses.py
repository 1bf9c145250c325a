"""Losses: the registry `LOSSES`, keyed by the config's names.

A loss whose `fuses` names the network's output activation consumes the pre-activation (logits),
so softmax + cross-entropy and sigmoid + binary cross-entropy are single stable nodes.
"""

from __future__ import annotations

from typing import ClassVar

from ..core.graph import Node, Op, nn


class Loss:
    name: ClassVar[str] = ""
    fuses: ClassVar[str | None] = None      # the output activation folded into this loss
    task: ClassVar[str] = "regression"       # classification | binary | regression

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        raise NotImplementedError  # abstract


class CrossEntropy(Loss):
    name, fuses, task = "cross_entropy", "softmax", "classification"

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.SoftmaxCrossEntropy(prediction, target)


class BinaryCrossEntropy(Loss):
    name, fuses, task = "binary_cross_entropy", "sigmoid", "binary"

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.BinaryCrossEntropy(prediction, target, from_logits=fused)


class MeanSquaredError(Loss):
    name = "mse"

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.MeanSquaredError(prediction, target)


class MeanAbsoluteError(Loss):
    name = "mae"

    def node(self, prediction: Node, target: Node, fused: bool) -> Op:
        return nn.MeanAbsoluteError(prediction, target)


LOSSES: dict[str, type[Loss]] = {
    cls.name: cls for cls in (CrossEntropy, BinaryCrossEntropy, MeanSquaredError, MeanAbsoluteError)
}
