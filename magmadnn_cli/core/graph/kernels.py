"""Fused cupy kernels for the hottest elementwise work on the GPU, where each separate numpy-style
operation would be its own kernel launch. Built on first use; never imported on a CPU-only path."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def elementwise(name: str) -> Any:
    import cupy  # noqa: PLC0415 (only called when arrays live on the GPU)

    specs = {
        "sigmoid": ("T z", "T y", "y = (T)1 / ((T)1 + exp(-z))"),
        "sigmoid_grad": ("T y, T g", "T d", "d = g * y * ((T)1 - y)"),
        "tanh_grad": ("T y, T g", "T d", "d = g * ((T)1 - y * y)"),
        "relu_grad": ("T z, T g", "T d", "d = z > (T)0 ? g : (T)0"),
        "sgd_decay_step": ("T g, T lr, T keep", "T p", "p = keep * p - lr * g"),
    }
    inputs, outputs, body = specs[name]
    return cupy.ElementwiseKernel(inputs, outputs, body, f"magmadnn_{name}")
