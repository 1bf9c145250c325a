"""The compute graph: nodes, ops with forward + backward, reverse-mode autodiff."""

from .node import Constant, Graph, Node, Op, Parameter, Variable, unbroadcast
from . import ops, nn
from .activations import ACTIVATIONS, get_activation


def sum(x: Node, axis=None, keepdims: bool = False) -> Node:  # noqa: A001 (mirrors numpy)
    return ops.Sum(x, axis=axis, keepdims=keepdims)


def mean(x: Node, axis=None, keepdims: bool = False) -> Node:
    return ops.Mean(x, axis=axis, keepdims=keepdims)


def exp(x: Node) -> Node:
    return ops.Exp(x)


def log(x: Node) -> Node:
    return ops.Log(x)


def activation(x: Node, name: str, **kwargs: float) -> Node:
    return nn.Activate(x, get_activation(name, **kwargs))


__all__ = ["ACTIVATIONS", "Constant", "Graph", "Node", "Op", "Parameter", "Variable", "activation",
           "exp", "get_activation", "log", "mean", "nn", "ops", "sum", "unbroadcast"]
