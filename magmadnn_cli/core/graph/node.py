"""Graph nodes and reverse-mode autodiff (MagmaDNN's Operation & Graph).

A graph is defined once (`op::var`, `op::matmul`, ...), then run many times: `Graph.forward`
evaluates nodes in topological order, `Graph.backward` walks them in reverse and sums the gradient
each node receives from any number of consumers.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Sequence

import numpy as np

from .. import backend as B

Array = Any  # numpy.ndarray or cupy.ndarray


class Node:
    """A value in the graph. `grad` holds d(output)/d(value) after `Graph.backward`."""

    inputs: tuple["Node", ...] = ()
    requires_grad: bool = False

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.value: Array | None = None
        self.grad: Array | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape) if self.value is not None else ()

    # Operator overloading builds graph nodes, so `(x - 3) ** 2 + c` is a graph.
    def __add__(self, other: Any) -> "Node": return _op("Add")(self, as_node(other))
    def __radd__(self, other: Any) -> "Node": return _op("Add")(as_node(other), self)
    def __sub__(self, other: Any) -> "Node": return _op("Sub")(self, as_node(other))
    def __rsub__(self, other: Any) -> "Node": return _op("Sub")(as_node(other), self)
    def __mul__(self, other: Any) -> "Node": return _op("Mul")(self, as_node(other))
    def __rmul__(self, other: Any) -> "Node": return _op("Mul")(as_node(other), self)
    def __truediv__(self, other: Any) -> "Node": return _op("Div")(self, as_node(other))
    def __rtruediv__(self, other: Any) -> "Node": return _op("Div")(as_node(other), self)
    def __matmul__(self, other: Any) -> "Node": return _op("MatMul")(self, as_node(other))
    def __neg__(self) -> "Node": return _op("Neg")(self)
    def __pow__(self, exponent: float) -> "Node": return _op("Pow")(self, exponent=float(exponent))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, shape={self.shape})"


def _op(name: str) -> type:
    from . import ops  # ops import this module
    return getattr(ops, name)


class Variable(Node):
    """A placeholder fed at each run (a batch of inputs or targets), or a free variable to optimize."""

    def __init__(self, name: str = "", value: Array | None = None, requires_grad: bool = False) -> None:
        super().__init__(name)
        self.value = value
        self.requires_grad = requires_grad


class Constant(Node):
    """A fixed value."""

    def __init__(self, value: Any, name: str = "") -> None:
        super().__init__(name)
        self.value = B.current().xp.asarray(value, dtype=B.current().floatx)


class Parameter(Node):
    """A trainable array. A network keeps all parameters (and gradients) as views of one flat buffer."""

    requires_grad = True

    def __init__(self, value: Array, name: str = "") -> None:
        super().__init__(name)
        self.value = value
        self.grad_view: Array | None = None  # where gradients accumulate (a view of the flat buffer)

    @property
    def size(self) -> int:
        return int(np.prod(self.value.shape))


def as_node(x: Any) -> Node:
    return x if isinstance(x, Node) else Constant(x)


IN_PLACE = object()  # returned by `Op.backward` for an input whose gradient it wrote to `grad_out`


class Op(Node):
    """An operation: `forward` computes the value, `backward` maps the output gradient to one
    gradient per input, each shaped like that input (None for inputs that need none).

    `grad_out[i]`, when not None, is the parameter buffer where input i's gradient belongs: the graph
    running the backward pass sets it, just before `backward`, for parameters only this op consumes
    in that graph (ops may be shared by several graphs); an op may write there and return IN_PLACE."""

    grad_out: tuple[Array | None, ...] = ()

    def __init__(self, *inputs: Node, name: str = "") -> None:
        super().__init__(name or type(self).__name__.lower())
        self.inputs = tuple(inputs)
        self.requires_grad = any(i.requires_grad for i in inputs)

    def forward(self, *xs: Array) -> Array:
        raise NotImplementedError  # abstract: every op defines it

    def backward(self, grad: Array) -> Sequence[Array | None]:
        raise NotImplementedError  # abstract: every op defines it


def topological_order(outputs: Iterable[Node]) -> list[Node]:
    """All nodes the outputs depend on, inputs before consumers (iterative, so deep graphs are fine)."""
    order: list[Node] = []
    seen: set[int] = set()
    for out in outputs:
        stack: list[tuple[Node, bool]] = [(out, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((i, False) for i in reversed(node.inputs) if id(i) not in seen)
    return order


class Graph:
    """A fixed set of output nodes evaluated together; the node order is computed once."""

    def __init__(self, *outputs: Node) -> None:
        self.outputs = outputs
        self.nodes = topological_order(outputs)
        self.ops = [n for n in self.nodes if isinstance(n, Op)]
        self.parameters = [n for n in self.nodes if isinstance(n, Parameter)]
        consumers: dict[int, int] = {}
        for op in self.ops:
            for i in op.inputs:
                consumers[id(i)] = consumers.get(id(i), 0) + 1
        # This graph's own choice of in-place gradient targets: parameters with a single consumer here.
        self.sole_consumer = [tuple(isinstance(i, Parameter) and consumers[id(i)] == 1 for i in op.inputs)
                              for op in self.ops]

    def forward(self, feed: dict[Variable, Array] | None = None) -> list[Array]:
        for var, value in (feed or {}).items():
            var.value = value
        for op in self.ops:
            op.value = op.forward(*(i.value for i in op.inputs))
        return [o.value for o in self.outputs]

    def backward(self, loss: Node | None = None, after_op: Any = None, scale: float = 1.0) -> None:
        """Reverse-mode autodiff from a scalar `loss` (default: the first output), seeded with
        d(scale * loss)/d(loss) = scale. `after_op(op)`, if given, is called once each op's gradients
        are in place (e.g. to start communicating them)."""
        loss = loss or self.outputs[0]
        for node in self.nodes:
            node.grad = None
        fresh = {id(p) for p in self.parameters}  # parameters whose grad view still holds old data
        xp = B.array_module(loss.value)
        if isinstance(scale, (int, float)):
            loss.grad = xp.full_like(loss.value, scale)
        else:  # a device scalar (a loss scale): copied on the device
            loss.grad = xp.empty_like(loss.value)
            loss.grad[...] = scale
        for op, sole in zip(reversed(self.ops), reversed(self.sole_consumer)):
            if op.grad is None or not op.requires_grad:
                continue
            op.grad_out = tuple(i.grad_view if only else None for i, only in zip(op.inputs, sole))
            for node, g in zip(op.inputs, op.backward(op.grad)):
                if g is None or not node.requires_grad:
                    continue
                if g is IN_PLACE:
                    fresh.discard(id(node))
                    node.grad = node.grad_view
                    continue
                if isinstance(node, Parameter) and node.grad_view is not None:
                    if id(node) in fresh:
                        fresh.discard(id(node))
                        B.array_module(g).copyto(node.grad_view, g)
                    else:
                        node.grad_view += g
                    node.grad = node.grad_view
                else:
                    node.grad = g if node.grad is None else node.grad + g
            if after_op is not None:
                after_op(op)
        for p in self.parameters:  # a parameter the loss does not reach has a zero gradient
            if id(p) in fresh and p.grad_view is not None:
                p.grad_view.fill(0)
                p.grad = p.grad_view


def unbroadcast(grad: Array, shape: tuple[int, ...]) -> Array:
    """Sum `grad` over the axes that broadcasting added or stretched, giving back `shape`."""
    if grad.shape == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


def column_sums(a: Array, out: Array | None = None) -> Array:
    """a.sum(axis=0) of a 2-D array (pass a.T for row sums); on the CPU as ones @ a, which BLAS
    does faster than numpy's sum (docs/performance.md)."""
    if B.array_module(a) is not np:
        return a.sum(axis=0, out=out)
    return np.matmul(_ones(a.shape[0], a.dtype), a, out=out)


@functools.cache
def _ones(n: int, dtype: Any) -> np.ndarray:
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones
