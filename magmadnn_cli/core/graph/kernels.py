"""Fused cupy kernels for the hottest elementwise work on the GPU, where each separate numpy-style
operation would be its own kernel launch. Each kernel is declared once: its CUDA body and, beside it,
its numpy reference (what the kernel computes, written on host arrays: the inputs, then the outputs it
writes in place). The reference is what the suite's device stand-in runs and what a GPU test compares
the kernel with. Built on first use; never imported on a CPU-only path."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import numpy as np

PREFIX = "magmadnn_"


@dataclass(frozen=True)
class Kernel:
    inputs: str
    outputs: str
    body: str
    reference: Callable[..., None]


def _sigmoid(z: np.ndarray, y: np.ndarray) -> None:
    y[...] = 1 / (1 + np.exp(-z))


def _sigmoid_grad(y: np.ndarray, g: np.ndarray, d: np.ndarray) -> None:
    d[...] = g * y * (1 - y)


def _tanh_grad(y: np.ndarray, g: np.ndarray, d: np.ndarray) -> None:
    d[...] = g * (1 - y * y)


def _relu_grad(z: np.ndarray, g: np.ndarray, d: np.ndarray) -> None:
    d[...] = np.where(z > 0, g, 0)


def _sgd_decay_step(g: np.ndarray, lr: Any, keep: Any, p: np.ndarray) -> None:
    p[...] = keep * p - lr * g


KERNELS = {
    "sigmoid": Kernel("T z", "T y", "y = (T)1 / ((T)1 + exp(-z))", _sigmoid),
    "sigmoid_grad": Kernel("T y, T g", "T d", "d = g * y * ((T)1 - y)", _sigmoid_grad),
    "tanh_grad": Kernel("T y, T g", "T d", "d = g * ((T)1 - y * y)", _tanh_grad),
    "relu_grad": Kernel("T z, T g", "T d", "d = z > (T)0 ? g : (T)0", _relu_grad),
    "sgd_decay_step": Kernel("T g, T lr, T keep", "T p", "p = keep * p - lr * g", _sgd_decay_step),
}


def reference(kernel_name: str) -> Callable[..., None]:
    """The numpy reference of the kernel built as `kernel_name` ('magmadnn_sigmoid')."""
    return KERNELS[kernel_name.removeprefix(PREFIX)].reference


@cache
def elementwise(name: str) -> Any:
    import cupy  # noqa: PLC0415 (only called when arrays live on the GPU)

    kernel = KERNELS[name]
    return cupy.ElementwiseKernel(kernel.inputs, kernel.outputs, kernel.body, PREFIX + name)
