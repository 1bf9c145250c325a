"""Weight initializers: the registry `INITIALIZERS`. Weights are drawn on the host with numpy's
seeded generator, so a seed gives the same network on CPU and GPU."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..errors import MagmaError

Init = Callable[[np.random.Generator, tuple[int, ...], int, int], np.ndarray]


def zeros(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    return np.zeros(shape)


def ones(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    return np.ones(shape)


def constant(value: float) -> Init:
    return lambda rng, shape, fan_in, fan_out: np.full(shape, value)


def uniform(limit: float = 0.05) -> Init:
    return lambda rng, shape, fan_in, fan_out: rng.uniform(-limit, limit, shape)


def normal(stddev: float = 0.05) -> Init:
    return lambda rng, shape, fan_in, fan_out: rng.normal(0.0, stddev, shape)


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


INITIALIZERS: dict[str, Callable[..., Init] | Init] = {
    "zeros": zeros, "ones": ones, "constant": constant, "uniform": uniform, "normal": normal,
    "glorot_uniform": glorot_uniform, "glorot_normal": glorot_normal,
    "xavier_uniform": glorot_uniform, "xavier_normal": glorot_normal,
    "he_uniform": he_uniform, "he_normal": he_normal,
}
_FACTORIES = {"constant", "uniform", "normal"}  # these take parameters (value / limit / stddev)


def get_initializer(spec: str | dict) -> Init:
    """`spec` is a name (`he_normal`) or a mapping with `type` and parameters ({type: constant, value: 0.1})."""
    params = {}
    if isinstance(spec, dict):
        params = {k: v for k, v in spec.items() if k != "type"}
        spec = spec.get("type", "")
    if spec not in INITIALIZERS:
        raise MagmaError(f"unknown initializer {spec!r} (expected one of {', '.join(INITIALIZERS)})")
    if spec in _FACTORIES:
        return INITIALIZERS[spec](**params)  # type: ignore[operator]
    if params:
        raise MagmaError(f"initializer {spec!r} takes no parameters; received {sorted(params)}")
    return INITIALIZERS[spec]  # type: ignore[return-value]
