"""Layers, each implementing one declaration of `config/layers.py`: its math (`__call__`) and its ONNX form
(`onnx`) side by side; the registry `LAYERS` is built from them. Their contract is in `layer_base`."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import layers as decl
from ..config.layers import pair
from ..core import backend as B
from ..core.graph import Node, Op, get_activation
from ..core.graph import conv, nn, ops, parallel
from .initializers import get_initializer
from .layer_base import BufferSpec, Context, Layer, Shape, WeightSpec, all_layers

__all__ = ["LAYERS", "BufferSpec", "Context", "Layer", "Shape", "WeightSpec", "all_layers"]


class Input(Layer):
    """The network's input; checks the per-sample shape of the data."""
    declaration = decl.InputLayer

    def __init__(self, declared: decl.InputLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.shape = tuple(declared.shape)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if input_shape != self.shape:
            raise self._error(f"expected input of shape {self.shape}; received {input_shape}")
        return self.shape

    def __call__(self, x: Node, ctx: Context) -> Node:
        return x

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        return x


class Dense(Layer):
    """Fully connected: act(x @ W + b), W of shape (inputs, units), b of shape (units,)."""
    declaration = decl.DenseLayer

    def __init__(self, declared: decl.DenseLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.units, self.use_bias = declared.units, declared.use_bias
        self.kernel_init = get_initializer(declared.kernel_initializer)
        self.bias_init = get_initializer(declared.bias_initializer)
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
            spec.keep_part(0 if spec.name == "bias" else 1, slice(start, start + self.widths[group.rank]))

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

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        y = g.op("MatMul", x, self.onnx_weight(g, weights, "kernel"))
        bias = self.onnx_weight(g, weights, "bias")
        return self.onnx_activation(g, g.op("Add", y, bias) if bias else y)

    def flops(self) -> int:
        return 2 * self.input_shape[0] * self.units + (self.units if self.use_bias else 0)


class Activation(Layer):
    declaration = decl.ActivationLayer

    def __call__(self, x: Node, ctx: Context) -> Node:
        if self.activation == "linear":
            return x
        return nn.Activate(x, get_activation(self.activation, **self.activation_args))

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        return self.onnx_activation(g, x)

    def flops(self) -> int:
        return math.prod(self.input_shape)


class Dropout(Layer):
    """Inverted dropout; active only in training."""
    declaration = decl.DropoutLayer

    def __init__(self, declared: decl.DropoutLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.rate = declared.rate

    def __call__(self, x: Node, ctx: Context) -> Node:
        return nn.Dropout(x, self.rate, ctx.mode, ctx.new_stream())

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        return x  # inference: the identity


class Flatten(Layer):
    declaration = decl.FlattenLayer

    def compute_shape(self, input_shape: Shape) -> Shape:
        return (math.prod(input_shape),)

    def __call__(self, x: Node, ctx: Context) -> Node:
        return ops.Flatten(x)

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        return g.op("Flatten", x, axis=1)


class Conv2D(Layer):
    """2-D convolution on (channels, height, width) samples; weights (filters, channels, kh, kw)."""
    declaration = decl.Conv2DLayer

    def __init__(self, declared: decl.Conv2DLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.algorithm = declared.conv_algorithm
        self.ops: list[conv.Conv2D] = []  # the graph's nodes running this layer (tuning sets their algorithm)
        self.filters, self.use_bias = declared.filters, declared.use_bias
        self.kernel, self.stride = pair(declared.kernel_size), pair(declared.stride)
        self.dilation, self.pad = pair(declared.dilation), declared.pad()
        self.kernel_init = get_initializer(declared.kernel_initializer)
        self.bias_init = get_initializer(declared.bias_initializer)

    def geometry(self) -> conv.Geometry:
        return conv.Geometry(self.kernel, self.stride, self.pad, self.dilation)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise self._error(f"expected (channels, height, width) input; received {input_shape}. "
                              "Set data.shape, e.g. [1, 28, 28].")
        c, h, w = input_shape
        ho, wo = (conv.output_size(size, k, s, p, d) for size, k, s, p, d in
                  zip((h, w), self.kernel, self.stride, self.pad, self.dilation))
        if ho < 1 or wo < 1:
            raise self._error(f"a {self.kernel} kernel does not fit input {input_shape} (output {ho}x{wo})")
        self._check_extent(c, h + 2 * self.pad[0], w + 2 * self.pad[1], ho * wo)
        kh, kw = self.kernel
        self.add_weight("kernel", (self.filters, c, kh, kw), self.kernel_init, c * kh * kw, self.filters * kh * kw)
        if self.use_bias:
            self.add_weight("bias", (self.filters,), self.bias_init, c * kh * kw, self.filters * kh * kw)
        return (self.filters, ho, wo)

    def _check_extent(self, channels: int, height: int, width: int, outputs: int) -> None:
        """One sample's padded input and output must fit in memory (Python ints: no overflow), so huge
        padding or dilation is refused by `validate` as by `train`, before anything is allocated."""
        values = channels * height * width + self.filters * outputs
        B.require_memory(values * np.dtype(B.current().floatx).itemsize,
                         f"layer {self.name!r} (conv2d, padding {self.spec.padding}, dilation {self.spec.dilation}): "
                         f"one sample's padded input ({channels} x {height} x {width}) and output "
                         f"({self.filters} x {outputs:,} positions)")

    def __call__(self, x: Node, ctx: Context) -> Node:
        op = conv.Conv2D(x, self.weights["kernel"], self.weights.get("bias"), self.stride, self.pad,
                         self.dilation, self.algorithm)
        self.ops.append(op)
        y: Node = op
        if self.activation == "linear":
            return y
        return nn.Activate(y, get_activation(self.activation, **self.activation_args))

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        (ph, pw), bias = self.pad, self.onnx_weight(g, weights, "bias")
        inputs = [x, self.onnx_weight(g, weights, "kernel")] + ([bias] if bias else [])
        y = g.op("Conv", *inputs, strides=list(self.stride), dilations=list(self.dilation), pads=[ph, pw, ph, pw],
                 kernel_shape=list(self.kernel))
        return self.onnx_activation(g, y)

    def flops(self) -> int:
        f, ho, wo = self.output_shape
        c, (kh, kw) = self.input_shape[0], self.kernel
        return 2 * f * ho * wo * c * kh * kw + (f * ho * wo if self.use_bias else 0)


class Pool2D(Layer):
    """Max or average pooling; the stride defaults to the window."""
    declaration = decl.Pool2DLayer

    def __init__(self, declared: decl.Pool2DLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.mode, self.window = declared.mode, pair(declared.pool_size)
        self.stride = pair(declared.stride) if declared.stride is not None else self.window
        self.pad = pair(declared.padding)

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

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        (ph, pw), window, stride = self.pad, list(self.window), list(self.stride)
        if self.mode == "max":
            return g.op("MaxPool", x, kernel_shape=window, strides=stride, pads=[ph, pw, ph, pw])
        return g.op("AveragePool", x, kernel_shape=window, strides=stride, pads=[ph, pw, ph, pw], count_include_pad=1)

    def flops(self) -> int:
        return math.prod(self.output_shape) * self.window[0] * self.window[1]


class BatchNorm(Layer):
    """Batch normalization over the feature axis (units after dense, channels after conv2d)."""
    declaration = decl.BatchNormLayer

    def __init__(self, declared: decl.BatchNormLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.momentum, self.epsilon = declared.momentum, declared.epsilon

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

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        """Inference form: gamma (x - mean) / sqrt(var + eps) + beta per feature (axis 1), folded into
        one scale and one shift (computed in float64)."""
        w = {k: weights[f"{self.name}/{k}"].astype(np.float64) for k in ("gamma", "beta", "running_mean", "running_var")}
        scale, shape = w["gamma"] / np.sqrt(w["running_var"] + self.epsilon), (1, -1) + (1,) * (len(self.input_shape) - 1)
        shift = w["beta"] - scale * w["running_mean"]
        return g.op("Add", g.op("Mul", x, g.const(scale.reshape(shape), "bn_scale")), g.const(shift.reshape(shape), "bn_shift"))

    def flops(self) -> int:
        return 4 * math.prod(self.input_shape)


class LayerNorm(Layer):
    """Layer normalization (Ba, Kiros & Hinton 2016) over each sample's values, with `gamma` and `beta`
    of the sample's shape: PyTorch's nn.LayerNorm(normalized_shape=<the sample's shape>)."""
    declaration = decl.LayerNormLayer

    def compute_shape(self, input_shape: Shape) -> Shape:
        size = math.prod(input_shape)
        self.add_weight("gamma", input_shape, get_initializer("ones"), size, size)
        self.add_weight("beta", input_shape, get_initializer("zeros"), size, size)
        return input_shape

    def __call__(self, x: Node, ctx: Context) -> Node:
        return LayerNormOp(x, self.weights["gamma"], self.weights["beta"], self.spec.epsilon)

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        return g.op("LayerNormalization", x, self.onnx_weight(g, weights, "gamma"),
                    self.onnx_weight(g, weights, "beta"), axis=1, epsilon=self.spec.epsilon)

    def flops(self) -> int:
        return 8 * math.prod(self.input_shape)


class LayerNormOp(Op):
    """y = gamma (x - mean) / sqrt(var + eps) + beta, the mean and (biased) variance over each row's
    values; dx = (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) / sqrt(var + eps), dxhat = g gamma."""

    def __init__(self, x: Node, gamma: Node, beta: Node, epsilon: float) -> None:
        super().__init__(x, gamma, beta, name="layer_norm")
        self.epsilon = epsilon

    def forward(self, x: Any, gamma: Any, beta: Any) -> Any:
        axes = tuple(range(1, x.ndim))
        centred = x - x.mean(axis=axes, keepdims=True)
        var = (centred * centred).mean(axis=axes, keepdims=True)
        self.inv_std = 1.0 / B.array_module(x).sqrt(var + self.epsilon)
        self.xhat = centred * self.inv_std
        return gamma * self.xhat + beta

    def backward(self, g: Any) -> Sequence[Any]:
        axes = tuple(range(1, g.ndim))
        dxhat = g * self.inputs[1].value
        mean_dxhat = dxhat.mean(axis=axes, keepdims=True)
        mean_dxhat_xhat = (dxhat * self.xhat).mean(axis=axes, keepdims=True)
        dx = (dxhat - mean_dxhat - self.xhat * mean_dxhat_xhat) * self.inv_std
        return dx, (g * self.xhat).sum(axis=0), g.sum(axis=0)


class GlobalAvgPool(Layer):
    """(C, H, W) -> (C,): the mean over each channel's positions."""
    declaration = decl.GlobalAvgPoolLayer

    def compute_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3:
            raise self._error(f"expected (channels, height, width) input; received {input_shape}")
        return (input_shape[0],)

    def __call__(self, x: Node, ctx: Context) -> Node:
        return ops.Mean(x, axis=(2, 3))

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        return g.op("Flatten", g.op("GlobalAveragePool", x), axis=1)

    def flops(self) -> int:
        return math.prod(self.input_shape)


class Reshape(Layer):
    declaration = decl.ReshapeLayer

    def __init__(self, declared: decl.ReshapeLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.shape = tuple(declared.shape)

    def compute_shape(self, input_shape: Shape) -> Shape:
        if math.prod(self.shape) != math.prod(input_shape):
            raise self._error(f"cannot reshape {input_shape} ({math.prod(input_shape)} values) to {self.shape}")
        return self.shape

    def __call__(self, x: Node, ctx: Context) -> Node:
        return ops.Reshape(x, self.shape, keep_batch=True)

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        return g.op("Reshape", x, g.const([-1, *self.shape], "shape", np.int64))


class Residual(Layer):
    """y = act(x + f(x)), f being the inner layers (a ResNet block); f must keep the shape."""
    declaration = decl.ResidualLayer

    def __init__(self, declared: decl.ResidualLayer, name: str = "") -> None:
        super().__init__(declared, name)
        self.inner = build_layers(declared.layers)
        for layer in all_layers(self.inner):  # every depth: a block's blocks' layers too
            layer.name = f"{self.name}.{layer.name}"

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

    def onnx(self, g: Any, x: str, weights: Mapping[str, np.ndarray]) -> str:
        h = x
        for layer in self.inner:
            h = layer.onnx(g, h, weights)
        return self.onnx_activation(g, g.op("Add", h, x))

    def flops(self) -> int:
        return sum(layer.flops() for layer in self.inner) + math.prod(self.output_shape)


LAYERS = Layer.implementations


def build_layers(declared: Sequence[decl.LayerSpec]) -> list[Layer]:
    """The runtime layers of these declarations, named as `config.rules.layer_names` says."""
    return [LAYERS[d.type](d, name=d.name or f"{d.type}_{index}") for index, d in enumerate(declared)]
