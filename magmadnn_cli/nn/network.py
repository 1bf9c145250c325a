"""A network assembled from layers (MagmaDNN's Model): one flat parameter buffer and one flat
gradient buffer, each layer's weights being views into them, a training graph ending in the loss
and a prediction graph ending in the output."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core import backend as B
from ..errors import ShapeError
from ..core.graph import Graph, Node, Parameter, Variable, get_activation, nn
from .layers import Context, Layer, Shape, all_layers
from .losses import Loss

Array = Any
STATS = 3  # trailing slots of the step buffer: loss sum, correct count, stop request


class Network:
    def __init__(self, layers: Sequence[Layer], input_shape: Shape, loss: Loss | None = None,
                 seed: int = 0) -> None:
        self.layers = list(layers)
        self.input_shape = tuple(input_shape)
        self.loss = loss
        self.mode = nn.Mode()
        shape = self.input_shape
        self.activation_size = 0  # floats of layer outputs per sample (for memory estimates)
        for layer in self.layers:
            shape = layer.build(shape)
            self.activation_size += int(np.prod(shape))
        self.output_shape = shape
        self._allocate(np.random.default_rng(seed))
        self.rng = B.rng(seed + 1)  # dropout draws; its state goes into checkpoints
        self._build_graphs(Context(self.mode, self.rng))

    # -- parameters ---------------------------------------------------------------------------
    def _allocate(self, rng: np.random.Generator) -> None:
        """Initialize every weight on the host, then place all of them in one flat device buffer."""
        specs = [(layer, spec) for layer in all_layers(self.layers) for spec in layer.specs]
        sizes = [int(np.prod(spec.shape)) for _, spec in specs]
        if sizes:
            biggest = max(range(len(sizes)), key=sizes.__getitem__)
            layer, spec = specs[biggest]
            B.require_memory(3 * sum(sizes) * np.dtype(B.floatx).itemsize,
                             f"the model's {sum(sizes):,} parameters (largest: {layer.name}/{spec.name} of shape "
                             f"{tuple(spec.shape)}), with their gradients,")
        host = np.empty(sum(sizes), dtype=B.floatx)
        offset = 0
        for (layer, spec), size in zip(specs, sizes):
            host[offset:offset + size] = spec.init(rng, spec.shape, spec.fan_in, spec.fan_out).ravel()
            offset += size
        self.parameters: list[Parameter] = []
        self.parameter_shapes = [tuple(spec.shape) for _, spec in specs]
        for layer, spec in specs:
            p = Parameter(None, f"{layer.name}/{spec.name}")
            layer.weights[spec.name] = p
            self.parameters.append(p)
        # Gradients plus STATS trailing slots (a step's loss sum, correct count and a stop request),
        # so data-parallel training reduces all of them with one Allreduce of `step_buffer`.
        self.place(B.to_device(host), B.xp.zeros(host.size + STATS, dtype=B.floatx))

    def place(self, flat_params: Array, step_buffer: Array) -> None:
        """Make these flat buffers the network's parameters and gradients (+ stats): every weight
        becomes a view into them. Used once at construction, and again to move them into shared
        memory (the caller fills `flat_params`)."""
        self.flat_params, self.step_buffer = flat_params, step_buffer
        self.flat_grads = step_buffer[:flat_params.size]
        self.step_stats = step_buffer[flat_params.size:]
        offset = 0
        for p, shape in zip(self.parameters, self.parameter_shapes):
            size = int(np.prod(shape))
            p.value = flat_params[offset:offset + size].reshape(shape)
            p.grad_view = self.flat_grads[offset:offset + size].reshape(shape)
            offset += size
        for graph in ("train_graph", "eval_graph", "predict_graph"):
            if hasattr(self, graph):
                getattr(self, graph).bind_gradients()

    def training_bytes(self, batch: int, optimizer_slots: int) -> int:
        """A lower bound on training memory: weights, gradients, optimizer state, and each layer's
        output and its gradient for a batch."""
        floats = self.flat_params.size * (2 + optimizer_slots) + 2 * batch * self.activation_size
        return int(floats) * np.dtype(B.floatx).itemsize

    @property
    def num_parameters(self) -> int:
        return int(self.flat_params.size)

    def buffers(self) -> dict[str, Array]:
        """Non-trainable state by stable name (e.g. `batchnorm_1/running_mean`)."""
        return {f"{layer.name}/{k}": v for layer in all_layers(self.layers) for k, v in layer.buffers.items()}

    def state(self) -> dict[str, np.ndarray]:
        """Weights and buffers by stable name (`<layer>/<weight>`) as host arrays."""
        state = {p.name: B.to_host(p.value).copy() for p in self.parameters}
        state.update({k: B.to_host(v).copy() for k, v in self.buffers().items()})
        return state

    def load_state(self, weights: dict[str, np.ndarray]) -> None:
        for name, buffer in self.buffers().items():
            if name in weights and tuple(weights[name].shape) == tuple(buffer.shape):
                buffer[...] = B.to_device(weights[name], dtype=buffer.dtype)
        for p in self.parameters:
            if p.name not in weights:
                raise ShapeError(f"the saved weights have no {p.name!r}; they hold {sorted(weights)}")
            w = weights[p.name]
            if tuple(w.shape) != tuple(p.value.shape):
                raise ShapeError(f"weight {p.name!r}: expected shape {tuple(p.value.shape)}; received {tuple(w.shape)}")
            p.value[...] = B.to_device(w, dtype=p.value.dtype)

    # -- graphs -------------------------------------------------------------------------------
    def _build_graphs(self, ctx: Context) -> None:
        self.x = Variable("x")
        self.y = Variable("y")
        last = self.layers[-1]
        fused = self.loss is not None and self.loss.fuses is not None and last.activation == self.loss.fuses
        self.fused = fused
        h: Node = self.x
        for layer in self.layers[:-1]:
            h = layer(h, ctx)
        if fused:
            self.logits = last(h, ctx, activation="linear")
            self.output = nn.Activate(self.logits, get_activation(last.activation))
        else:
            self.output = self.logits = last(h, ctx)
        self.predict_graph = Graph(self.output)
        self.loss_node = None
        if self.loss is not None:
            self.loss_node = self.loss.node(self.logits, self.y, fused)
            self.train_graph = Graph(self.loss_node)
            self.eval_graph = Graph(self.loss_node, self.output)

    def _check_input(self, x: Array) -> None:
        if tuple(x.shape[1:]) != self.input_shape:
            raise ShapeError(f"the network expects samples of shape {self.input_shape}; "
                             f"received a batch of shape {tuple(x.shape)}")

    def forward_backward(self, x: Array, y: Array) -> Array:
        """One training forward + backward pass; gradients land in `flat_grads`. Returns the loss
        (a 0-d device array, so no host sync is forced)."""
        if self.loss_node is None:
            raise ShapeError("this network was built without a loss; it can only predict")
        self._check_input(x)
        self.mode.training = True
        (loss,) = self.train_graph.forward({self.x: x, self.y: y})
        self.train_graph.backward()
        return loss

    def loss_and_output(self, x: Array, y: Array) -> tuple[Array, Array]:
        """Eval-mode loss and predictions for one batch."""
        self._check_input(x)
        self.mode.training = False
        loss, out = self.eval_graph.forward({self.x: x, self.y: y})
        return loss, out

    def predict(self, x: Array) -> Array:
        """Eval-mode outputs (probabilities for classifiers) for a batch."""
        self._check_input(x)
        self.mode.training = False
        (out,) = self.predict_graph.forward({self.x: x})
        return out
