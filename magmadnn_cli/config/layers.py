"""The layers' declarations (one per layer: name, hyperparameters, defaults, ranges, facts) and the
weight initializers'. `Layer` is the union of every declaration; the runtime layers in `nn/layers.py`
take these validated objects."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, PositiveInt, model_validator

from .activations import ALPHA_ACTIVATIONS, DECLARATIONS, ActivationName
from .base import Declared, PositiveFloat, Strict, UnitFloat


# -- initializers --------------------------------------------------------------------------------
InitializerName = Literal["zeros", "ones", "glorot_uniform", "glorot_normal", "xavier_uniform", "xavier_normal",
                          "he_uniform", "he_normal", "uniform", "normal"]


class InitializerSpec(Declared):
    """An initializer with parameters; the names in `InitializerName` take their defaults."""
    declarations: ClassVar[dict[str, type[Declared]]] = {}


class ConstantInit(InitializerSpec):
    type: Literal["constant"]
    value: float


class UniformInit(InitializerSpec):
    type: Literal["uniform"]
    limit: PositiveFloat = 0.05


class NormalInit(InitializerSpec):
    type: Literal["normal"]
    stddev: PositiveFloat = 0.05


Initializer = Union[InitializerName, InitializerSpec.union()]


# -- layers --------------------------------------------------------------------------------------
SAFE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"  # one path component, not . or .., no separators
IntOrPair = Union[PositiveInt, Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]]
NonNegative = Annotated[int, Field(ge=0)]
Padding = Union[NonNegative, Annotated[list[NonNegative], Field(min_length=2, max_length=2)]]


def pair(value: int | list[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (value[0], value[1])


class LayerSpec(Declared):
    """Facts every layer declares: `cancels_bias` (it subtracts each feature's mean, so a bias right
    before it learns nothing) and `width_field` (the hyperparameter that sets its output width). A
    layer without an `activation` field passes the output activation of the layer before it through."""
    declarations: ClassVar[dict[str, type[Declared]]] = {}
    cancels_bias: ClassVar[bool] = False
    width_field: ClassVar[str | None] = None
    keeps_range: ClassVar[bool] = False  # its outputs lie in its input's range (a bounded head stays bounded)

    name: str | None = Field(None, pattern=SAFE_NAME,
                             description="stable name for the layer's weights (default <type>_<index>)")


class InputLayer(LayerSpec):
    type: Literal["input"]
    shape: list[PositiveInt] = Field(description="per-sample shape; must match the data")


class AlphaFor(LayerSpec):
    """`alpha` means something only for leaky_relu and elu."""

    @model_validator(mode="after")
    def _alpha_needs_its_activation(self) -> "AlphaFor":
        activation = getattr(self, "activation", "linear")
        if getattr(self, "alpha", None) is not None and activation not in ALPHA_ACTIVATIONS:
            raise ValueError(f"alpha is the slope/scale of {' and '.join(ALPHA_ACTIVATIONS)}; activation "
                             f"{activation!r} takes none: remove alpha or change the activation")
        return self

    @property
    def activation_args(self) -> dict[str, float]:
        """The activation's parameters: alpha as given, else as declared, where it takes one."""
        alpha, declared = getattr(self, "alpha", None), DECLARATIONS[getattr(self, "activation", "linear")].alpha
        return {} if declared is None else {"alpha": declared if alpha is None else alpha}


class DenseLayer(AlphaFor):
    type: Literal["dense"]
    width_field: ClassVar[str | None] = "units"
    units: PositiveInt
    activation: ActivationName = "linear"
    alpha: float | None = Field(None, description="slope/scale for leaky_relu and elu")
    use_bias: bool = True
    kernel_initializer: Initializer = "glorot_uniform"
    bias_initializer: Initializer = "zeros"


class ActivationLayer(AlphaFor):
    type: Literal["activation"]
    activation: ActivationName
    alpha: float | None = None


class DropoutLayer(LayerSpec):
    keeps_range: ClassVar[bool] = True
    type: Literal["dropout"]
    rate: UnitFloat


class FlattenLayer(LayerSpec):
    keeps_range: ClassVar[bool] = True
    type: Literal["flatten"]


class Conv2DLayer(AlphaFor):
    type: Literal["conv2d"]
    width_field: ClassVar[str | None] = "filters"
    filters: PositiveInt
    kernel_size: IntOrPair = 3
    stride: IntOrPair = 1
    padding: Union[Literal["valid", "same"], Padding] = "valid"
    dilation: IntOrPair = 1
    activation: ActivationName = "linear"
    alpha: float | None = None
    use_bias: bool = True
    kernel_initializer: Initializer = "he_uniform"
    bias_initializer: Initializer = "zeros"
    conv_algorithm: Literal["auto", "fastest", "gemm", "winograd", "fft"] = Field(
        "auto", description="auto: a fixed rule of the layer's shape (the same model on any machine load and rank "
        "count); fastest: time each algorithm that can run the layer when training starts and keep the fastest "
        "(opt-in: timing depends on the machine's load; pinned in the run's config); winograd needs 3x3 stride 1 "
        "undilated kernels, fft stride 1 (else gemm runs)")

    @model_validator(mode="after")
    def _same_padding_fits(self) -> "Conv2DLayer":
        span = [d * (k - 1) for k, d in zip(pair(self.kernel_size), pair(self.dilation))]
        if self.padding == "same" and (any(s % 2 for s in span) or pair(self.stride) != (1, 1)):
            raise ValueError(f"padding 'same' needs stride 1 and an odd (dilated) kernel; received kernel_size="
                             f"{self.kernel_size}, stride={self.stride}, dilation={self.dilation}")
        return self

    def pad(self) -> tuple[int, int]:
        """The zero padding of each side, (height, width)."""
        if self.padding == "valid":
            return (0, 0)
        if self.padding == "same":
            (kh, kw), (dh, dw) = pair(self.kernel_size), pair(self.dilation)
            return (dh * (kh - 1) // 2, dw * (kw - 1) // 2)
        return pair(self.padding)


class Pool2DLayer(LayerSpec):
    keeps_range: ClassVar[bool] = True
    type: Literal["pool2d"]
    mode: Literal["max", "avg"] = "max"
    pool_size: IntOrPair = 2
    stride: IntOrPair | None = Field(None, description="default: the pool size")
    padding: Padding = 0

    @model_validator(mode="after")
    def _padding_inside_the_window(self) -> "Pool2DLayer":
        """A window of padding alone has no value to pool (a max of -inf: a NaN loss)."""
        if any(p >= k for p, k in zip(pair(self.padding), pair(self.pool_size))):
            raise ValueError(f"padding {self.padding} must be smaller than pool_size {self.pool_size} (a window "
                             "could then hold padding only)")
        return self


class BatchNormLayer(LayerSpec):
    type: Literal["batchnorm"]
    cancels_bias: ClassVar[bool] = True
    momentum: UnitFloat = 0.9
    epsilon: PositiveFloat = 1e-5


class LayerNormLayer(LayerSpec):
    """Normalizes each sample over all its non-batch axes, then scales by `gamma` and shifts by `beta`
    (learned, of the sample's shape): PyTorch's nn.LayerNorm(normalized_shape=<the sample's shape>)."""
    type: Literal["layer_norm"]
    epsilon: PositiveFloat = 1e-5


class GlobalAvgPoolLayer(LayerSpec):
    keeps_range: ClassVar[bool] = True
    type: Literal["global_avg_pool"]


class ReshapeLayer(LayerSpec):
    keeps_range: ClassVar[bool] = True
    type: Literal["reshape"]
    shape: list[PositiveInt] = Field(min_length=1)


class ResidualLayer(LayerSpec):
    """A ResNet block: act(x + layers(x)); the inner layers must keep the shape."""
    type: Literal["residual"]
    layers: list["Layer"] = Field(min_length=1)
    activation: ActivationName = "linear"


Layer = LayerSpec.union()
ResidualLayer.model_rebuild()


def passes_through(layer: Any) -> bool:
    """Whether the output activation looks through this layer (config spec or built layer): it has
    no activation of its own."""
    return "activation" not in LayerSpec.declarations[layer.type].model_fields


class ModelConfig(Strict):
    layers: list[Layer] = Field(min_length=1)

    def with_convolutions(self, ran: list[str]) -> "ModelConfig":
        """Every `conv_algorithm: auto` or `fastest` layer set to the algorithm it ran (`ran`: the
        network's convolutions, in the layers' order, blocks' inner layers included)."""
        algorithms = iter(ran)

        def pinned(specs: list[Any]) -> list[Any]:
            out = []
            for spec in specs:
                if "conv_algorithm" in type(spec).model_fields:
                    algorithm = next(algorithms)
                    spec = spec.revised(conv_algorithm=algorithm) if spec.conv_algorithm in ("auto", "fastest") else spec
                elif getattr(spec, "layers", None):
                    spec = spec.revised(layers=pinned(spec.layers))
                out.append(spec)
            return out
        return self.revised(layers=pinned(self.layers))
