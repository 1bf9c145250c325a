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


def _sgd_decay_step(g: np.ndarray, lr: Any, keep: Any, ok: Any, p: np.ndarray) -> None:
    p[...] = np.where(ok, keep * p - lr * g, p)


# Optimizer updates, one pass over the parameters, gradients and slots; `ok` false (a non-finite step)
# leaves everything as it was, decided on the device. `wd` is coupled L2 decay (g + wd p); `shrink` is
# decoupled decay (p - shrink p, AdamW's lr wd).
def _momentum_step(g: np.ndarray, lr: Any, wd: Any, mu: Any, nesterov: Any, ok: Any, p: np.ndarray,
                   v: np.ndarray) -> None:
    gg = g + wd * p
    vv = mu * v + gg
    step = np.where(nesterov, gg + mu * vv, vv)
    p[...], v[...] = np.where(ok, p - lr * step, p), np.where(ok, vv, v)


def _adam_step(g: np.ndarray, lr_m: Any, v_scale: Any, b1: Any, b2: Any, eps: Any, wd: Any, shrink: Any, ok: Any,
               p: np.ndarray, m: np.ndarray, v: np.ndarray) -> None:
    gg = g + wd * p
    mm = b1 * m + (1 - b1) * gg
    vv = b2 * v + (1 - b2) * gg * gg
    new = (p - shrink * p) - lr_m * mm / (np.sqrt(vv * v_scale) + eps)
    p[...], m[...], v[...] = np.where(ok, new, p), np.where(ok, mm, m), np.where(ok, vv, v)


def _adamax_step(g: np.ndarray, lr_m: Any, b1: Any, b2: Any, eps: Any, wd: Any, ok: Any, p: np.ndarray,
                 m: np.ndarray, u: np.ndarray) -> None:
    gg = g + wd * p
    mm = b1 * m + (1 - b1) * gg
    uu = np.maximum(b2 * u, np.abs(gg) + eps)
    p[...], m[...], u[...] = np.where(ok, p - lr_m * mm / uu, p), np.where(ok, mm, m), np.where(ok, uu, u)


def _square_step(g: np.ndarray, lr: Any, keep: Any, add: Any, eps: Any, wd: Any, ok: Any, p: np.ndarray,
                 s: np.ndarray) -> None:
    """RMSprop (keep = rho, add = 1 - rho) and Adagrad (keep = add = 1): s <- keep s + add g^2."""
    gg = g + wd * p
    ss = keep * s + add * gg * gg
    p[...], s[...] = np.where(ok, p - lr * gg / (np.sqrt(ss) + eps), p), np.where(ok, ss, s)


KERNELS = {
    "sigmoid": Kernel("T z", "T y", "y = (T)1 / ((T)1 + exp(-z))", _sigmoid),
    "sigmoid_grad": Kernel("T y, T g", "T d", "d = g * y * ((T)1 - y)", _sigmoid_grad),
    "tanh_grad": Kernel("T y, T g", "T d", "d = g * ((T)1 - y * y)", _tanh_grad),
    "relu_grad": Kernel("T z, T g", "T d", "d = z > (T)0 ? g : (T)0", _relu_grad),
    "sgd_decay_step": Kernel("T g, T lr, T keep, bool ok", "T p", "if (ok) p = keep * p - lr * g", _sgd_decay_step),
    "momentum_step": Kernel(
        "T g, T lr, T wd, T mu, bool nesterov, bool ok", "T p, T v",
        "T gg = g + wd * p; T vv = mu * v + gg; T step = nesterov ? gg + mu * vv : vv;"
        "if (ok) { p = p - lr * step; v = vv; }", _momentum_step),
    "adam_step": Kernel(
        "T g, T lr_m, T v_scale, T b1, T b2, T eps, T wd, T shrink, bool ok", "T p, T m, T v",
        "T gg = g + wd * p; T mm = b1 * m + ((T)1 - b1) * gg; T vv = b2 * v + ((T)1 - b2) * gg * gg;"
        "if (ok) { p = (p - shrink * p) - lr_m * mm / (sqrt(vv * v_scale) + eps); m = mm; v = vv; }", _adam_step),
    "adamax_step": Kernel(
        "T g, T lr_m, T b1, T b2, T eps, T wd, bool ok", "T p, T m, T u",
        "T gg = g + wd * p; T mm = b1 * m + ((T)1 - b1) * gg; T uu = max(b2 * u, fabs(gg) + eps);"
        "if (ok) { p = p - lr_m * mm / uu; m = mm; u = uu; }", _adamax_step),
    "square_step": Kernel(
        "T g, T lr, T keep, T add, T eps, T wd, bool ok", "T p, T s",
        "T gg = g + wd * p; T ss = keep * s + add * gg * gg;"
        "if (ok) { p = p - lr * gg / (sqrt(ss) + eps); s = ss; }", _square_step),
}


def reference(kernel_name: str) -> Callable[..., None]:
    """The numpy reference of the kernel built as `kernel_name` ('magmadnn_sigmoid')."""
    return KERNELS[kernel_name.removeprefix(PREFIX)].reference


@cache
def elementwise(name: str) -> Any:
    import cupy  # only called when arrays live on the GPU

    kernel = KERNELS[name]
    return cupy.ElementwiseKernel(kernel.inputs, kernel.outputs, kernel.body, PREFIX + name)
