"""Layers as graph pieces: the registry `LAYERS`, keyed by the config's `type` tag.

A layer's contract (Keras' build/call): hyperparameters in `__init__`; `build(input_shape)` declares
its weights and returns the output shape (per sample, without the batch axis); `__call__` adds its
nodes to the graph once the network has placed the weights in its flat buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .errors import MagmaError, ShapeError
from .graph import Node, Parameter, get_activation
from .graph import nn, ops
from .initializers import Init, get_initializer

Shape = tuple[int, ...]


@dataclass
class WeightSpec:
    name: str
    shape: Shape
    init: Init
    fan_in: int
    fan_out: int


@dataclass
class Context:
    """What layers need while building the graph: the train/eval switch and a device RNG."""
    mode: nn.Mode
    rng: Any


class Layer:
    type: ClassVar[str] = ""
    activation: str | None = None  # a fused output activation, if the layer has one

    def __init__(self, name: str = "") -> None:
        self.name = name or self.type
        self.specs: list[WeightSpec] = []
        self.weights: dict[str, Parameter] = {}
        self.input_shape: Shape = ()
        self.output_shape: Shape = ()

    def build(self, input_shape: Shape) -> Shape:
        self.input_shape = input_shape
        self.output_shape = self.compute_shape(input_shape)
        return self.output_shape

    def compute_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def add_weight(self, name: str, shape: Shape, init: Init, fan_in: int, fan_out: int) -> None:
        self.specs.append(WeightSpec(name, shape, init, fan_in, fan_out))

    def __call__(self, x: Node, ctx: Context, activation: str | None = None) -> Node:
        raise NotImplementedError  # abstract: every layer defines it

    def flops(self) -> int:
        """Floating-point operations per sample in the forward pass (multiply-add = 2)."""
        return 0

    def _error(self, message: str) -> ShapeError:
        return ShapeError(f"layer {self.name!r} ({self.type}): {message}")


def _positive(layer: str, field: str, value: int) -> int:
    if value <= 0:
        raise MagmaError(f"layer {layer!r}: {field} must be positive; received {field}={value}")
    return value


class Input(Layer):
    """The network's input; checks the per-sample shape of the data."""
    type = "input"

    def __init__(self, shape: Shape, name: str = "") -> None:
        super().__init__(name)
        self.shape = tuple(_positive(self.name, "shape", int(s)) for s in shape)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if input_shape != self.shape:
            raise self._error(f"expected input of shape {self.shape}; received {input_shape}")
        return self.shape

    def __call__(self, x: Node, ctx: Context, activation: str | None = None) -> Node:
        return x


class Dense(Layer):
    """Fully connected: act(x @ W + b), W of shape (inputs, units), b of shape (units,)."""
    type = "dense"

    def __init__(self, units: int, activation: str = "linear", use_bias: bool = True,
                 kernel_initializer: str | dict = "glorot_uniform", bias_initializer: str | dict = "zeros",
                 name: str = "", **activation_args: float) -> None:
        super().__init__(name)
        self.units = _positive(self.name, "units", int(units))
        self.activation = activation
        self.activation_args = activation_args
        get_activation(activation, **activation_args)  # fail early on an unknown name
        self.use_bias = use_bias
        self.kernel_init = get_initializer(kernel_initializer)
        self.bias_init = get_initializer(bias_initializer)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 1:
            raise self._error(f"expected flat input of shape (features,); received {input_shape}. "
                              "Add a `flatten` layer before it.")
        fan_in = input_shape[0]
        self.add_weight("kernel", (fan_in, self.units), self.kernel_init, fan_in, self.units)
        if self.use_bias:
            self.add_weight("bias", (self.units,), self.bias_init, fan_in, self.units)
        return (self.units,)

    def __call__(self, x: Node, ctx: Context, activation: str | None = None) -> Node:
        name = activation or self.activation
        fn = get_activation(name, **(self.activation_args if name == self.activation else {}))
        return nn.Dense(x, self.weights["kernel"], self.weights.get("bias"), fn, name=self.name)

    def flops(self) -> int:
        return 2 * self.input_shape[0] * self.units + (self.units if self.use_bias else 0)


class Activation(Layer):
    type = "activation"

    def __init__(self, activation: str, name: str = "", **activation_args: float) -> None:
        super().__init__(name)
        self.activation = activation
        self.activation_args = activation_args
        get_activation(activation, **activation_args)

    def __call__(self, x: Node, ctx: Context, activation: str | None = None) -> Node:
        name = activation or self.activation
        if name == "linear":
            return x
        return nn.Activate(x, get_activation(name, **(self.activation_args if name == self.activation else {})))

    def flops(self) -> int:
        return int(np.prod(self.input_shape))


class Dropout(Layer):
    """Inverted dropout; active only in training."""
    type = "dropout"

    def __init__(self, rate: float, name: str = "") -> None:
        super().__init__(name)
        if not 0.0 <= rate < 1.0:
            raise MagmaError(f"layer {self.name!r}: rate must be in [0, 1); received rate={rate}")
        self.rate = rate

    def __call__(self, x: Node, ctx: Context, activation: str | None = None) -> Node:
        return nn.Dropout(x, self.rate, ctx.mode, ctx.rng)


class Flatten(Layer):
    type = "flatten"

    def compute_shape(self, input_shape: Shape) -> Shape:
        return (int(np.prod(input_shape)),)

    def __call__(self, x: Node, ctx: Context, activation: str | None = None) -> Node:
        return ops.Flatten(x)


LAYERS: dict[str, type[Layer]] = {cls.type: cls for cls in (Input, Dense, Activation, Dropout, Flatten)}
