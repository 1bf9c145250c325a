"""Layers as graph pieces: the registry `LAYERS`, keyed by the config's `type` tag (the contract
they follow is in `layer_base`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import MagmaError
from ..core.graph import Node, get_activation
from ..core.graph import conv, nn, ops, parallel
from .initializers import get_initializer
from .layer_base import BufferSpec, Context, Layer, Shape, WeightSpec, positive, all_layers

__all__ = ["LAYERS", "BufferSpec", "Context", "Layer", "Shape", "WeightSpec", "all_layers"]


class Input(Layer):
    """The network's input; checks the per-sample shape of the data."""
    type = "input"

    def __init__(self, shape: Shape, name: str = "") -> None:
        super().__init__(name)
        self.shape = tuple(positive(self.name, "shape", int(s)) for s in shape)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if input_shape != self.shape:
            raise self._error(f"expected input of shape {self.shape}; received {input_shape}")
        return self.shape

    def __call__(self, x: Node, ctx: Context) -> Node:
        return x


class Dense(Layer):
    """Fully connected: act(x @ W + b), W of shape (inputs, units), b of shape (units,)."""
    type = "dense"

    def __init__(self, units: int, activation: str = "linear", use_bias: bool = True,
                 kernel_initializer: str | dict = "glorot_uniform", bias_initializer: str | dict = "zeros",
                 name: str = "", **activation_args: float) -> None:
        super().__init__(name)
        self.units = positive(self.name, "units", int(units))
        self.activation = activation
        self.activation_args = activation_args
        get_activation(activation, **activation_args)  # fail early on an unknown name
        self.use_bias = use_bias
        self.kernel_init = get_initializer(kernel_initializer)
        self.bias_init = get_initializer(bias_initializer)
        self.group: Any = None  # the model-parallel ranks its units are split over (see `split_over`)
        self.widths: list[int] = []

    def split_over(self, group: Any) -> None:
        """Hold only this rank's share of the units (columns of W, entries of b); the outputs are
        gathered over `group`. Layers with fewer units than ranks stay whole."""
        if group.size < 2 or self.units < group.size:
            return
        q, r = divmod(self.units, group.size)
        self.group, self.widths = group, [q + (k < r) for k in range(group.size)]  # as np.array_split
        start = sum(self.widths[:group.rank])
        for spec in self.specs:
            spec.split(0 if spec.name == "bias" else 1, slice(start, start + self.widths[group.rank]))

    def compute_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 1:
            raise self._error(f"expected flat input of shape (features,); received {input_shape}. "
                              "Add a `flatten` layer before it.")
        fan_in = input_shape[0]
        self.add_weight("kernel", (fan_in, self.units), self.kernel_init, fan_in, self.units)
        if self.use_bias:
            self.add_weight("bias", (self.units,), self.bias_init, fan_in, self.units)
        return (self.units,)

    def __call__(self, x: Node, ctx: Context) -> Node:
        fn = get_activation(self.activation, **self.activation_args)
        if self.group is None:
            return nn.Dense(x, self.weights["kernel"], self.weights.get("bias"), fn, name=self.name)
        on_part = get_activation("linear") if fn.row_wise else fn  # softmax: over the gathered row
        part = nn.Dense(parallel.ToParts(x, self.group), self.weights["kernel"], self.weights.get("bias"), on_part,
                        name=self.name)
        whole = parallel.GatherColumns(part, self.group, self.widths)
        return nn.Activate(whole, fn) if fn.row_wise else whole

    def flops(self) -> int:
        return 2 * self.input_shape[0] * self.units + (self.units if self.use_bias else 0)


class Activation(Layer):
    type = "activation"

    def __init__(self, activation: str, name: str = "", **activation_args: float) -> None:
        super().__init__(name)
        self.activation = activation
        self.activation_args = activation_args
        get_activation(activation, **activation_args)

    def __call__(self, x: Node, ctx: Context) -> Node:
        if self.activation == "linear":
            return x
        return nn.Activate(x, get_activation(self.activation, **self.activation_args))

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

    def __call__(self, x: Node, ctx: Context) -> Node:
        return nn.Dropout(x, self.rate, ctx.mode, ctx.new_stream())


class Flatten(Layer):
    type = "flatten"

    def compute_shape(self, input_shape: Shape) -> Shape:
        return (int(np.prod(input_shape)),)

    def __call__(self, x: Node, ctx: Context) -> Node:
        return ops.Flatten(x)


def _pair(layer: str, field: str, value: int | Sequence[int]) -> tuple[int, int]:
    pair = (int(value), int(value)) if isinstance(value, int) else tuple(int(v) for v in value)
    if len(pair) != 2 or min(pair) < 0:
        raise MagmaError(f"layer {layer!r}: {field} must be a non-negative int or [h, w]; received {value!r}")
    return pair  # type: ignore[return-value]


class Conv2D(Layer):
    """2-D convolution on (channels, height, width) samples; weights (filters, channels, kh, kw)."""
    type = "conv2d"

    def __init__(self, filters: int, kernel_size: int | Sequence[int] = 3, stride: int | Sequence[int] = 1,
                 padding: str | int | Sequence[int] = "valid", dilation: int | Sequence[int] = 1,
                 activation: str = "linear", use_bias: bool = True, kernel_initializer: str | dict = "he_uniform",
                 bias_initializer: str | dict = "zeros", conv_algorithm: str = "auto", name: str = "",
                 **activation_args: float) -> None:
        super().__init__(name)
        if conv_algorithm not in conv.CHOICES:
            raise MagmaError(f"layer {self.name!r}: conv_algorithm must be one of {', '.join(conv.CHOICES)}; "
                             f"received {conv_algorithm!r}")
        self.algorithm = conv_algorithm
        self.ops: list[conv.Conv2D] = []  # the graph's nodes running this layer (tuning sets their algorithm)
        self.filters = positive(self.name, "filters", int(filters))
        self.kernel = _pair(self.name, "kernel_size", kernel_size)
        self.stride = _pair(self.name, "stride", stride)
        self.dilation = _pair(self.name, "dilation", dilation)
        if min(self.kernel + self.stride + self.dilation) < 1:
            raise MagmaError(f"layer {self.name!r}: kernel_size, stride and dilation must be positive")
        self.padding = padding
        self.activation, self.activation_args = activation, activation_args
        get_activation(activation, **activation_args)
        self.use_bias = use_bias
        self.kernel_init, self.bias_init = get_initializer(kernel_initializer), get_initializer(bias_initializer)

    def _pad(self) -> tuple[int, int]:
        if self.padding == "valid":
            return (0, 0)
        if self.padding == "same":
            span = [d * (k - 1) for k, d in zip(self.kernel, self.dilation)]
            if any(s % 2 for s in span) or self.stride != (1, 1):
                raise MagmaError(f"layer {self.name!r}: padding 'same' needs stride 1 and an odd (dilated) "
                                 f"kernel; received kernel_size={self.kernel}, stride={self.stride}")
            return (span[0] // 2, span[1] // 2)
        return _pair(self.name, "padding", self.padding)  # type: ignore[arg-type]

    def geometry(self) -> conv.Geometry:
        return conv.Geometry(self.kernel, self.stride, self._pad(), self.dilation)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise self._error(f"expected (channels, height, width) input; received {input_shape}. "
                              "Set data.shape, e.g. [1, 28, 28].")
        c, h, w = input_shape
        pad = self._pad()
        ho, wo = (conv.output_size(size, k, s, p, d) for size, k, s, p, d in
                  zip((h, w), self.kernel, self.stride, pad, self.dilation))
        if ho < 1 or wo < 1:
            raise self._error(f"a {self.kernel} kernel does not fit input {input_shape} (output {ho}x{wo})")
        kh, kw = self.kernel
        self.add_weight("kernel", (self.filters, c, kh, kw), self.kernel_init, c * kh * kw, self.filters * kh * kw)
        if self.use_bias:
            self.add_weight("bias", (self.filters,), self.bias_init, c * kh * kw, self.filters * kh * kw)
        return (self.filters, ho, wo)

    def __call__(self, x: Node, ctx: Context) -> Node:
        op = conv.Conv2D(x, self.weights["kernel"], self.weights.get("bias"), self.stride, self._pad(),
                         self.dilation, self.algorithm)
        self.ops.append(op)
        y: Node = op
        if self.activation == "linear":
            return y
        return nn.Activate(y, get_activation(self.activation, **self.activation_args))

    def flops(self) -> int:
        f, ho, wo = self.output_shape
        c, (kh, kw) = self.input_shape[0], self.kernel
        return 2 * f * ho * wo * c * kh * kw + (f * ho * wo if self.use_bias else 0)


class Pool2D(Layer):
    """Max or average pooling; the stride defaults to the window."""
    type = "pool2d"

    def __init__(self, mode: str = "max", pool_size: int | Sequence[int] = 2, stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0, name: str = "") -> None:
        super().__init__(name)
        if mode not in ("max", "avg"):
            raise MagmaError(f"layer {self.name!r}: mode must be max or avg; received {mode!r}")
        self.mode = mode
        self.window = _pair(self.name, "pool_size", pool_size)
        self.stride = _pair(self.name, "stride", stride if stride is not None else self.window)
        self.pad = _pair(self.name, "padding", padding)
        if min(self.window + self.stride) < 1:
            raise MagmaError(f"layer {self.name!r}: pool_size and stride must be positive")

    def compute_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise self._error(f"expected (channels, height, width) input; received {input_shape}")
        c, h, w = input_shape
        ho, wo = (conv.output_size(size, k, s, p) for size, k, s, p in zip((h, w), self.window, self.stride, self.pad))
        if ho < 1 or wo < 1:
            raise self._error(f"a {self.window} window does not fit input {input_shape}")
        return (c, ho, wo)

    def __call__(self, x: Node, ctx: Context) -> Node:
        """Max pooling after an activation that commutes with max (relu, leaky relu) pools the
        pre-activation instead and activates the pooled values: the same values and gradients, with
        the activation's passes over a window-size smaller array."""
        if self.mode == "max" and isinstance(x, nn.Activate) and x.fn.commutes_with_max:
            return nn.Activate(conv.Pool2D(x.inputs[0], self.mode, self.window, self.stride, self.pad), x.fn)
        return conv.Pool2D(x, self.mode, self.window, self.stride, self.pad)

    def flops(self) -> int:
        return int(np.prod(self.output_shape)) * self.window[0] * self.window[1]


class BatchNorm(Layer):
    """Batch normalization over the feature axis (units after dense, channels after conv2d)."""
    type = "batchnorm"

    def __init__(self, momentum: float = 0.9, epsilon: float = 1e-5, name: str = "") -> None:
        super().__init__(name)
        if not 0.0 <= momentum < 1.0 or epsilon <= 0:
            raise MagmaError(f"layer {self.name!r}: need 0 <= momentum < 1 and epsilon > 0; "
                             f"received momentum={momentum}, epsilon={epsilon}")
        self.momentum, self.epsilon = momentum, epsilon

    def compute_shape(self, input_shape: Shape) -> Shape:
        features = input_shape[0]
        self.add_weight("gamma", (features,), get_initializer("ones"), features, features)
        self.add_weight("beta", (features,), get_initializer("zeros"), features, features)
        self.add_buffer("running_mean", (features,), 0.0)
        self.add_buffer("running_var", (features,), 1.0)
        return input_shape

    def __call__(self, x: Node, ctx: Context) -> Node:
        return nn.BatchNorm(x, self.weights["gamma"], self.weights["beta"], self.buffers["running_mean"],
                            self.buffers["running_var"], ctx.mode, self.momentum, self.epsilon)

    def flops(self) -> int:
        return 4 * int(np.prod(self.input_shape))


class GlobalAvgPool(Layer):
    """(C, H, W) -> (C,): the mean over each channel's positions."""
    type = "global_avg_pool"

    def compute_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise self._error(f"expected (channels, height, width) input; received {input_shape}")
        return (input_shape[0],)

    def __call__(self, x: Node, ctx: Context) -> Node:
        return ops.Mean(x, axis=(2, 3))

    def flops(self) -> int:
        return int(np.prod(self.input_shape))


class Reshape(Layer):
    type = "reshape"

    def __init__(self, shape: Sequence[int], name: str = "") -> None:
        super().__init__(name)
        self.shape = tuple(positive(self.name, "shape", int(v)) for v in shape)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if int(np.prod(self.shape)) != int(np.prod(input_shape)):
            raise self._error(f"cannot reshape {input_shape} ({int(np.prod(input_shape))} values) to {self.shape}")
        return self.shape

    def __call__(self, x: Node, ctx: Context) -> Node:
        return ops.Reshape(x, self.shape, keep_batch=True)


class Residual(Layer):
    """y = act(x + f(x)), f being the inner layers (a ResNet block); f must keep the shape."""
    type = "residual"

    def __init__(self, layers: Sequence[Layer], activation: str = "linear", name: str = "") -> None:
        super().__init__(name)
        self.inner = list(layers)
        if not self.inner:
            raise MagmaError(f"layer {self.name!r}: a residual block needs at least one inner layer")
        for layer in all_layers(self.inner):  # every depth: a block's blocks' layers too
            layer.name = f"{self.name}.{layer.name}"
        self.activation = activation
        get_activation(activation)

    def sublayers(self) -> list[Layer]:
        return self.inner

    def compute_shape(self, input_shape: Shape) -> Shape:
        shape = input_shape
        for layer in self.inner:
            shape = layer.build(shape)
        if shape != input_shape:
            raise self._error(f"the inner layers turn {input_shape} into {shape}; a residual block must keep "
                              "the shape (use padding: same and the input's channel count)")
        return shape

    def __call__(self, x: Node, ctx: Context) -> Node:
        h = x
        for layer in self.inner:
            h = layer(h, ctx)
        y: Node = ops.Add(h, x)
        return y if self.activation == "linear" else nn.Activate(y, get_activation(self.activation))

    def flops(self) -> int:
        return sum(layer.flops() for layer in self.inner) + int(np.prod(self.output_shape))


LAYERS: dict[str, type[Layer]] = {cls.type: cls for cls in (Input, Dense, Activation, Dropout, Flatten, Conv2D, Pool2D,
                                                             BatchNorm, GlobalAvgPool, Reshape, Residual)}
