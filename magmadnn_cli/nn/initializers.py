"""Weight initializers: the registries `INITIALIZERS` (by name) and `FACTORIES`
(declarations with parameters). Weights are drawn on the host with numpy's
seeded generator, so a seed gives the same network on CPU and GPU."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..config.layers import ConstantInit, InitializerSpec, NormalInit, UniformInit
from ..errors import MagmaError

Init = Callable[[np.random.Generator, tuple[int, ...], int, int], np.ndarray]


def zeros(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    return np.zeros(shape)


def ones(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    return np.ones(shape)


def constant(spec: ConstantInit) -> Init:
    return lambda rng, shape, fan_in, fan_out: np.full(shape, spec.value)


def uniform(spec: UniformInit) -> Init:
    return lambda rng, shape, fan_in, fan_out: rng.uniform(-spec.limit, spec.limit, shape)


def normal(spec: NormalInit) -> Init:
    return lambda rng, shape, fan_in, fan_out: rng.normal(0.0, spec.stddev, shape)


def glorot_uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    """U(-l, l), l = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010)."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape)


def glorot_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    """N(0, s^2), s = sqrt(2 / (fan_in + fan_out))."""
    return rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), shape)


def he_uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    """U(-l, l), l = sqrt(6 / fan_in) (He et al. 2015)."""
    limit = math.sqrt(6.0 / fan_in)
    return rng.uniform(-limit, limit, shape)


def he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    """N(0, s^2), s = sqrt(2 / fan_in)."""
    return rng.normal(0.0, math.sqrt(2.0 / fan_in), shape)


INITIALIZERS: dict[str, Init] = {  # the declared names (`config.layers.InitializerName`)
    "zeros": zeros, "ones": ones, "glorot_uniform": glorot_uniform, "glorot_normal": glorot_normal,
    "xavier_uniform": glorot_uniform, "xavier_normal": glorot_normal, "he_uniform": he_uniform, "he_normal": he_normal,
}
FACTORIES: dict[str, Callable[[Any], Init]] = {  # the declarations with parameters (`config.layers.InitializerSpec`)
    "constant": constant, "uniform": uniform, "normal": normal,
}


def get_initializer(spec: str | InitializerSpec | dict) -> Init:
    """`spec` is a declared name (`he_normal`, or `uniform` with its default limit) or a declaration
    with parameters ({type: constant, value: 0.1})."""
    if isinstance(spec, dict):
        spec = dict(spec)
        kind = InitializerSpec.declarations.get(spec.pop("type", ""))
        if kind is None:
            raise MagmaError(f"unknown initializer {spec!r} (expected one of {', '.join(FACTORIES)})")
        spec = kind.of(**spec)
    if isinstance(spec, str) and spec in FACTORIES:
        spec = InitializerSpec.declarations[spec].of()
    if isinstance(spec, InitializerSpec):
        return FACTORIES[spec.type](spec)
    if spec not in INITIALIZERS:
        raise MagmaError(f"unknown initializer {spec!r} (expected one of {', '.join([*INITIALIZERS, *FACTORIES])})")
    return INITIALIZERS[spec]
