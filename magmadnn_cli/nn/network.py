"""A network assembled from layers (MagmaDNN's Model): one flat parameter buffer and one flat
gradient buffer, each layer's weights being views into them, a training graph ending in the loss
and a prediction graph ending in the output."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..core import backend as B
from ..errors import ShapeError
from ..core.graph import Graph, Node, Parameter, Variable, get_activation, nn
from ..config.rules import output_head
from .layers import Context, Conv2D, Layer, Shape, all_layers
from .losses import Loss

Array = Any


class Network:
    """Owns the parameters (one flat buffer), their gradients (views of another) and the buffers
    (non-trainable state, e.g. running statistics); `state_dict` / `load_state_dict` carry all of them."""

    def __init__(self, layers: Sequence[Layer], input_shape: Shape, loss: Loss | None = None,
                 seed: int = 0, group: Any = None, class_weights: Array | None = None) -> None:
        """`group`: the model-parallel ranks (a communicator) that split the dense layers' units;
        each rank then holds its part of their weights (None or one rank: every layer whole);
        `class_weights`: per-class loss weights while training (training.class_weight), on the device."""
        self.layers = list(layers)
        self.input_shape = tuple(input_shape)
        self.loss = loss
        self.class_weights = class_weights
        self.mode = nn.Mode()
        shape = self.input_shape
        self.activation_size = 0  # floats of layer outputs per sample (for memory estimates)
        for layer in self.layers:
            shape = layer.build(shape)
            self.activation_size += math.prod(shape)
        self.output_shape = shape
        self.group = group
        for layer in all_layers(self.layers) if group is not None else []:
            layer.split_over(group)  # a layer that can hold only its part of the weights does so
        self.head = output_head(self.layers, loss.name if loss is not None else None)
        self._allocate(np.random.default_rng(seed))
        self._build_graphs(Context(self.mode))

    # -- parameters and buffers ---------------------------------------------------------------
    def _allocate(self, rng: np.random.Generator) -> None:
        """Initialize every weight on the host, then place all of them in one flat device buffer;
        allocate the layers' buffers on the device."""
        specs = [(layer, spec) for layer in all_layers(self.layers) for spec in layer.specs]
        sizes = [math.prod(spec.shape) for _, spec in specs]
        if sizes:
            self._check_allocation(specs, sizes)
        host = np.empty(sum(sizes), dtype=B.current().floatx)
        offset = 0
        for (layer, spec), size in zip(specs, sizes):
            host[offset:offset + size] = spec.initial(rng).ravel()
            offset += size
        self.parameters: list[Parameter] = []
        self.parameter_shapes = [tuple(spec.shape) for _, spec in specs]  # this rank's
        self.parameter_specs = [spec for _, spec in specs]
        for layer, spec in specs:
            p = Parameter(None, f"{layer.name}/{spec.name}")
            layer.weights[spec.name] = p
            self.parameters.append(p)
        for layer in all_layers(self.layers):
            layer.buffers = {b.name: B.to_device(np.full(b.shape, b.fill, dtype=B.current().floatx))
                             for b in layer.buffer_specs}
        self.place(B.to_device(host), B.current().xp.zeros(host.size, dtype=B.current().floatx))

    def _check_allocation(self, specs: list[tuple[Layer, Any]], sizes: list[int]) -> None:
        """The flat parameter and gradient buffers, plus the temporaries of drawing the weights (each
        tensor is drawn whole in float64 on the host, and a split tensor's part copied out), fit."""
        itemsize = np.dtype(B.current().floatx).itemsize
        draws = [8 * math.prod(spec.whole or spec.shape) + (8 * size if spec.whole else 0)
                 for (_, spec), size in zip(specs, sizes)]
        biggest = max(range(len(sizes)), key=draws.__getitem__)
        layer, spec = specs[biggest]
        what = (f"the model's {sum(sizes):,} parameters (largest: {layer.name}/{spec.name} of shape "
                f"{tuple(spec.whole or spec.shape)}), with their gradients,")
        how = "weights and gradients, each tensor drawn in float64 on the host first"
        buffers = 2 * sum(sizes) * itemsize
        if B.current().device == "cpu":
            B.require_memory(buffers + draws[biggest], what, how=how)
        else:
            B.require_memory(sum(sizes) * itemsize + draws[biggest], what, on_host=True, how=how)
            B.require_memory(buffers, what)

    def place(self, flat_params: Array, flat_grads: Array) -> None:
        """Make these flat buffers the network's parameters and gradients: every weight becomes a
        view into them. Used once at construction, and again by data parallelism to move them (into
        shared memory, or into a buffer that also carries the step's statistics); the caller fills
        `flat_params`."""
        self.flat_params, self.flat_grads = flat_params, flat_grads
        offset = 0
        for p, shape in zip(self.parameters, self.parameter_shapes):
            size = math.prod(shape)
            p.value = flat_params[offset:offset + size].reshape(shape)
            p.grad_view = flat_grads[offset:offset + size].reshape(shape)
            offset += size

    def flat_offset(self, parameter: Any) -> int:
        """Where `parameter` starts in the flat buffers (the order of `place`)."""
        offset = 0
        for p, shape in zip(self.parameters, self.parameter_shapes):
            if p is parameter:
                return offset
            offset += math.prod(shape)
        raise KeyError(parameter.name)

    def training_bytes(self, batch: int, optimizer_slots: int, eval_batch: int = 0) -> int:
        """A lower bound on training memory: weights, gradients, optimizer state, and each layer's
        output and its gradient for a training batch; an evaluation batch (`training.eval_batch_size`,
        at most the rows of the split it scores) replaces the outputs while the gradients stay."""
        activations = max(2 * batch, batch + eval_batch) * self.activation_size
        return (int(self.flat_params.size) * (2 + optimizer_slots) + activations) * np.dtype(B.current().floatx).itemsize

    @property
    def num_parameters(self) -> int:
        """The model's parameters (all of every split tensor)."""
        return sum(math.prod(spec.whole or spec.shape) for spec in self.parameter_specs)

    @property
    def local_parameters(self) -> int:
        """The parameters this rank holds."""
        return int(self.flat_params.size)

    def buffers(self) -> dict[str, Array]:
        """Non-trainable state by stable name (e.g. `batchnorm_1/running_mean`), as device arrays."""
        return {f"{layer.name}/{k}": v for layer in all_layers(self.layers) for k, v in layer.buffers.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Weights and buffers by stable name (`<layer>/<weight>`, `<layer>/<buffer>`), host copies."""
        state = {p.name: self._whole(B.to_host(p.value), spec) for p, spec in zip(self.parameters, self.parameter_specs)}
        state.update({k: B.to_host(v).copy() for k, v in self.buffers().items()})
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Copy every weight and buffer in place (views into shared buffers stay valid); all of
        them must be present with the right shape."""
        specs = {p.name: spec for p, spec in zip(self.parameters, self.parameter_specs)}
        targets = {p.name: p.value for p in self.parameters} | self.buffers()
        for name, target in targets.items():
            if name not in state:
                raise ShapeError(f"the saved state has no {name!r}; it holds {sorted(state)}")
            value, whole = state[name], specs[name].whole if name in specs else None
            if tuple(value.shape) != tuple(whole or target.shape):
                raise ShapeError(f"{name!r}: expected shape {tuple(whole or target.shape)}; received {tuple(value.shape)}")
        for name, target in targets.items():
            value = self._part(state[name], specs[name]) if name in specs else state[name]
            target[...] = B.to_device(value, dtype=target.dtype)

    # -- split tensors (model parallelism) --------------------------------------------------
    def _whole(self, part: np.ndarray, spec: Any) -> np.ndarray:
        """A split tensor gathered from the group's ranks (collective); others copied."""
        if spec.part is None:
            return part.copy()
        return np.concatenate(self.group.allgather(part), axis=spec.axis)

    @staticmethod
    def _part(whole: np.ndarray, spec: Any) -> np.ndarray:
        return whole if spec.part is None else whole[(slice(None),) * spec.axis + (spec.part,)]

    def flat_pieces(self, flat: Array) -> list[tuple[Array, bool]]:
        """Each parameter's piece of a flat buffer laid out like `flat_params`, with whether it is split."""
        bounds = np.cumsum([0, *(math.prod(s) for s in self.parameter_shapes)])
        return [(flat[a:b], spec.part is not None) for a, b, spec in zip(bounds, bounds[1:], self.parameter_specs)]

    def gather_flat(self, flat: Array) -> np.ndarray:
        """A buffer laid out like this rank's `flat_params`, in the whole model's layout (collective)."""
        pieces = [self._whole(B.to_host(piece).reshape(shape), spec).ravel() for (piece, _), shape, spec
                  in zip(self.flat_pieces(flat), self.parameter_shapes, self.parameter_specs)]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=B.current().floatx)

    def part_of_flat(self, whole: np.ndarray) -> np.ndarray:
        """The inverse of `gather_flat`: this rank's parts of a buffer in the whole model's layout."""
        pieces, offset = [], 0
        for spec in self.parameter_specs:
            size = math.prod(spec.whole or spec.shape)
            pieces.append(self._part(whole[offset:offset + size].reshape(spec.whole or spec.shape), spec).ravel())
            offset += size
        return np.concatenate(pieces) if pieces else whole

    # -- convolution algorithms ---------------------------------------------------------------
    def conv_layers(self) -> list[Conv2D]:
        return [layer for layer in all_layers(self.layers) if isinstance(layer, Conv2D)]

    def tune_convolutions(self, x: Array) -> dict[str, dict[str, float]]:
        """Time every algorithm that can run each `conv_algorithm: fastest` layer, one forward +
        backward on the activations this batch gives it, and keep the fastest. Returns the
        seconds per layer and algorithm."""
        auto = [layer for layer in self.conv_layers() if layer.algorithm == "fastest"]
        if not auto or len(x) == 0:
            return {}
        self.predict(x)  # leaves each convolution's input in its node
        times = {layer.name: layer.ops[0].tune(layer.ops[0].inputs[0].value) for layer in auto}
        self.set_conv_algorithms({layer.name: layer.ops[0].algorithm for layer in auto})
        return times

    def conv_algorithms(self) -> dict[str, str]:
        """The algorithm each convolution layer runs, by layer name."""
        return {layer.name: layer.ops[0].effective_algorithm(layer.weights["kernel"].value)
                for layer in self.conv_layers()}

    def set_conv_algorithms(self, chosen: dict[str, str]) -> None:
        for layer in self.conv_layers():
            for op in layer.ops:
                op.algorithm = chosen.get(layer.name, op.algorithm)

    # -- graphs -------------------------------------------------------------------------------
    def _build_graphs(self, ctx: Context) -> None:
        """The head (see `config.rules.output_head`) decides the output: with a fused loss the last
        layer is built without its activation, the loss takes its logits, predictions apply it."""
        self.x = Variable("x")
        self.y = Variable("y")
        h: Node = self.x
        for layer in self.layers[:-1]:
            h = layer(h, ctx)
        last = self.layers[-1]
        self.fused = self.head.fused
        if self.fused:
            self.logits = last.without_activation()(h, ctx)
            self.output: Node = nn.Activate(self.logits, get_activation(self.head.activation))
        else:
            self.output = self.logits = last(h, ctx)
        self.predict_graph = Graph(self.output)
        self.loss_node = None
        if self.loss is not None:
            self.loss_node = self.loss.node(self.logits, self.y, self.fused)
            self.train_graph = Graph(self.loss_node)
            self.eval_graph = Graph(self.loss_node, self.output)

    def _check_input(self, x: Array) -> None:
        if tuple(x.shape[1:]) != self.input_shape:
            raise ShapeError(f"the network expects samples of shape {self.input_shape}; "
                             f"received a batch of shape {tuple(x.shape)}")

    def forward_backward(self, x: Array, y: Array, scale: float = 1.0, positions: Array | None = None,
                         key: int = 0) -> Array:
        """One training forward + backward pass; the gradients of `scale` x the batch's mean loss
        land in `flat_grads`. `positions` (default 0..n-1) are the rows' places in the epoch's
        global order and `key` the epoch's random key: they decide dropout masks. Returns the mean
        loss (a 0-d device array, so no host sync is forced)."""
        if self.loss_node is None:
            raise ShapeError("this network was built without a loss; it can only predict")
        self._check_input(x)
        self.mode.training = True
        self.mode.set_batch(key, B.current().xp.arange(len(x)) if positions is None else positions)
        self.loss_node.weights = self.class_weights
        (loss,) = self.train_graph.forward({self.x: x, self.y: y})
        self.train_graph.backward(scale=scale)
        return loss
    def loss_and_output(self, x: Array, y: Array) -> tuple[Array, Array]:
        """Eval-mode loss and predictions for one batch."""
        self._check_input(x)
        self.mode.training = False
        self.loss_node.weights = None  # validation and test losses are unweighted
        loss, out = self.eval_graph.forward({self.x: x, self.y: y})
        return loss, out

    def predict(self, x: Array) -> Array:
        """Eval-mode outputs (probabilities for classifiers) for a batch."""
        self._check_input(x)
        self.mode.training = False
        (out,) = self.predict_graph.forward({self.x: x})
        return out
