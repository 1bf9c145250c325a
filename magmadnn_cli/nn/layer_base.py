"""The layer contract every layer follows (Keras' build/call): `__init__` takes the layer's validated
declaration (`config/layers.py`: hyperparameters, defaults, ranges); `build(input_shape)` declares its
weights and returns the output shape (per sample, without the batch axis); `__call__` adds its nodes to
the graph once the network has placed the weights in its flat buffer; `onnx` writes the same computation
into the ONNX exporter's graph. Also the weight and buffer declarations and the graph-building context."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..config.layers import LayerSpec
from ..errors import MagmaError, ShapeError
from ..core.graph import Node, Parameter, get_activation, nn
from .initializers import Init
from ..core.registry import Registered

Shape = tuple[int, ...]


@dataclass
class WeightSpec:
    """A weight to create: `shape` is what this rank holds; a layer split over ranks holds `part`
    (an index into the whole tensor of shape `whole`, split along `axis`), initialized as the
    matching part of the whole tensor, so any split starts from one process's weights."""
    name: str
    shape: Shape
    init: Init
    fan_in: int
    fan_out: int
    whole: Shape | None = None
    axis: int = 0
    part: slice | None = None

    def keep_part(self, axis: int, part: slice) -> None:
        self.whole, self.axis, self.part = self.shape, axis, part
        self.shape = tuple(part.stop - part.start if i == axis else n for i, n in enumerate(self.shape))

    def initial(self, rng: Any) -> Any:
        """This rank's initial values: the whole tensor's (same random stream), cut to `part`."""
        value = self.init(rng, self.whole or self.shape, self.fan_in, self.fan_out)
        return value if self.part is None else value[(slice(None),) * self.axis + (self.part,)]


@dataclass
class BufferSpec:
    name: str
    shape: Shape
    fill: float


@dataclass
class Context:
    """What layers need while building the graph: the step's mode (train/eval, rows' positions,
    the reduction over ranks), and a counter that gives each random layer its own stream."""
    mode: nn.Mode
    streams: int = 0

    def new_stream(self) -> int:
        self.streams += 1
        return self.streams


class Layer(Registered):
    """A runtime layer implements one declaration (`declaration`); every subclass that sets one is
    registered in `Layer.implementations` under its config name."""
    declaration: ClassVar[type[LayerSpec]]
    implementations: ClassVar[dict[str, type["Layer"]]] = {}

    type: str = ""  # the config name (a stage the data adds, declared nowhere, sets its own)

    def __init__(self, declared: LayerSpec | None, name: str = "") -> None:
        """`declared`: the layer's validated declaration (None: a stage the data adds, e.g. embeddings)."""
        self.spec, self.type = declared, declared.type if declared is not None else self.type
        self.name = name or (declared.name if declared is not None else "") or self.type
        self.activation: str | None = getattr(declared, "activation", None)  # the output activation, if any
        self.activation_args: dict[str, float] = getattr(declared, "activation_args", {})
        self.specs: list[WeightSpec] = []
        self.buffer_specs: list[BufferSpec] = []
        self.weights: dict[str, Parameter] = {}
        self.buffers: dict[str, Any] = {}  # non-trainable state saved with the model (running statistics)
        self.input_shape: Shape = ()
        self.output_shape: Shape = ()

    @classmethod
    def of(cls, **hyperparameters: Any) -> "Layer":
        """The layer from hyperparameters, validated by its declaration (`Dense.of(units=3)`)."""
        return cls(cls.declaration.of(**hyperparameters))

    def build(self, input_shape: Shape) -> Shape:
        self.input_shape = input_shape
        self.output_shape = self.compute_shape(input_shape)
        return self.output_shape

    def compute_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def add_weight(self, name: str, shape: Shape, init: Init, fan_in: int, fan_out: int) -> None:
        self.specs.append(WeightSpec(name, shape, init, fan_in, fan_out))

    def add_buffer(self, name: str, shape: Shape, fill: float) -> None:
        """Non-trainable state (e.g. running statistics): the network allocates it in `buffers`
        and saves it with the weights, in checkpoints and model files alike."""
        self.buffer_specs.append(BufferSpec(name, shape, fill))

    def __call__(self, x: Node, ctx: Context) -> Node:
        raise NotImplementedError  # abstract: every layer defines it

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        """This layer on graph value `x` in `g` (`training/onnx_graph.Graph`: ops by name, constants),
        its weights read from `weights` (a model file's arrays, `<layer>/<weight>`); returns the output's
        name. Built to the model's shapes first (`build`)."""
        raise MagmaError(f"layer {self.name!r} ({self.type}) cannot be exported to ONNX yet")

    def onnx_weight(self, g: Any, weights: Mapping[str, np.ndarray], name: str) -> str | None:
        """The weight `name` as a float32 constant of `g` (None: the layer has none, e.g. no bias)."""
        array = weights.get(f"{self.name}/{name}")
        return None if array is None else g.const(array.astype(np.float32), name)

    def onnx_activation(self, g: Any, z: str) -> str:
        """The layer's output activation of `z` in its declared ONNX form (`core/graph/activations.py`)."""
        return get_activation(self.activation or "linear", **self.activation_args).onnx(g, z)

    def flops(self) -> int:
        """Floating-point operations per sample in the forward pass (multiply-add = 2)."""
        return 0

    def without_activation(self) -> "Layer":
        """This layer (sharing its weights) with a linear output: a fused loss applies the activation."""
        bare = copy.copy(self)
        bare.activation, bare.activation_args = "linear", {}
        return bare

    def split_over(self, group: Any) -> None:
        """Model parallelism: hold only this rank's part of the weights, the ranks of `group` working
        together on every batch (by default a layer stays whole)."""

    def sublayers(self) -> list["Layer"]:
        """Layers inside this one (a block's); their weights belong to the network too."""
        return []

    def _error(self, message: str) -> ShapeError:
        return ShapeError(f"layer {self.name!r} ({self.type}): {message}")


def all_layers(layers: Sequence[Layer]) -> list[Layer]:
    """Every layer, blocks' inner layers included, in order."""
    return [x for layer in layers for x in (layer, *all_layers(layer.sublayers()))]
