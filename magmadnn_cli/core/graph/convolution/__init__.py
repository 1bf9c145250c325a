"""Convolution algorithms, the registry `ALGORITHMS` keyed by the config's `conv_algorithm`; `rule`,
the fixed choice of `auto` (the layer's geometry and channels decide, never timing, load or ranks);
and dMath's autotuning for `fastest`: time every algorithm that supports a layer, keep the fastest.

An algorithm is a class built per op with the layer's `Geometry`; `supports(geometry)` says whether
it can run that layer, `forward(x, w, b)` returns y and keeps what `backward(g, w, need_dx)` needs
to return (dx or None, dw, db)."""

from __future__ import annotations

import time
from typing import Any

from ... import backend as B
from ..node import Array
from .fft import FFT
from .gemm import Gemm
from .geometry import Geometry, Pair, output_size
from .winograd import Winograd

ALGORITHMS: dict[str, Any] = {"gemm": Gemm, "winograd": Winograd, "fft": FFT}
CHOICES = ("auto", "fastest", *ALGORITHMS)


def candidates(geometry: Geometry) -> list[str]:
    """The algorithms that can run a layer of this geometry (gemm runs every layer)."""
    return [name for name, algorithm in ALGORITHMS.items() if algorithm.supports(geometry)]


def rule(geometry: Geometry, in_channels: int, out_channels: int) -> str:
    """`conv_algorithm: auto`'s choice: gemm, for every layer. benchmarks/conv_rule.py timed every
    algorithm on 108 3x3 layers (1-64 channels in and out, 8-28 pixel maps, batch 32) on the CPU:
    gemm was the fastest or within 10% on most, winograd won only where many input channels meet a
    few outputs and then by under 1.7x, and no geometry feature separated its wins from its 3x
    losses (docs/performance.md). A fixed rule keeps a seed's model the same on any machine load and
    rank count; `fastest` times the candidates instead (opt-in, decided once on rank 0)."""
    return "gemm"


MARGIN = 0.9  # another algorithm replaces gemm only when it takes at most this share of gemm's time


def fastest(times: dict[str, float]) -> str:
    """The algorithm to run given measured seconds: the fastest, but gemm (the reference path)
    unless another beats it by 10%, so near ties do not flip from run to run."""
    best = min(times, key=times.__getitem__)
    return best if "gemm" not in times or times[best] <= MARGIN * times["gemm"] else "gemm"


def time_algorithms(geometry: Geometry, x: Array, w: Array, b: Array | None, need_dx: bool,
                    repeats: int = 3) -> dict[str, float]:
    """Seconds of one forward + backward pass of each candidate on this batch (best of `repeats`,
    after a warm-up run), measured with the device synchronized."""
    times = {}
    for name in candidates(geometry):
        algorithm = ALGORITHMS[name](geometry)
        g = None
        best = float("inf")
        for attempt in range(repeats + 1):
            B.synchronize()
            start = time.perf_counter()
            y = algorithm.forward(x, w, b)
            g = B.array_module(y).ones_like(y) if g is None else g
            algorithm.backward(g, w, need_dx)
            B.synchronize()
            if attempt:
                best = min(best, time.perf_counter() - start)
        times[name] = best
    return times


__all__ = ["ALGORITHMS", "CHOICES", "Geometry", "Pair", "candidates", "fastest", "output_size", "rule",
           "time_algorithms"]
