"""Convolution (im2col + one batched GEMM) and pooling (running max/sum) on NCHW arrays. Every loop
runs over the kh x kw kernel offsets only, never over samples or pixels."""

from __future__ import annotations

from typing import Sequence

from .. import backend as B
from .node import IN_PLACE, Array, Node, Op

Pair = tuple[int, int]


def output_size(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _windows(x: Array, kernel: Pair, stride: Pair, pad: Pair, dilation: Pair) -> Array:
    """(N, C, H, W) -> (N, C, kh, kw, Ho, Wo): the input under each kernel offset."""
    xp = B.array_module(x)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, pad, dilation
    n, c, h, w = x.shape
    ho, wo = output_size(h, kh, sh, ph, dh), output_size(w, kw, sw, pw, dw)
    if ph or pw:
        x = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = xp.empty((n, c, kh, kw, ho, wo), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i, j] = x[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
    return out


def _unwindows(cols: Array, shape: tuple[int, ...], stride: Pair, pad: Pair, dilation: Pair) -> Array:
    """The adjoint of `_windows`: add each offset's gradient back onto the input positions."""
    xp = B.array_module(cols)
    n, c, h, w = shape
    _, _, kh, kw, ho, wo = cols.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    dx = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            dx[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw] += cols[:, :, i, j]
    return dx[:, :, ph:ph + h, pw:pw + w]


class Conv2D(Op):
    """y[n, f] = sum_c,i,j w[f, c, i, j] x[n, c, s*y + d*i - p, s*x + d*j - p] + b[f]."""

    def __init__(self, x: Node, w: Node, b: Node | None, stride: Pair, pad: Pair, dilation: Pair) -> None:
        super().__init__(*((x, w) if b is None else (x, w, b)), name="conv2d")
        self.stride, self.pad, self.dilation = stride, pad, dilation

    def forward(self, x: Array, w: Array, b: Array | None = None) -> Array:
        f, c, kh, kw = w.shape
        self.cols = _windows(x, (kh, kw), self.stride, self.pad, self.dilation)
        n, _, _, _, ho, wo = self.cols.shape
        cols = self.cols.reshape(n, c * kh * kw, ho * wo)
        y = w.reshape(f, -1) @ cols                      # (N, F, Ho*Wo): one batched GEMM
        if b is not None:
            y += b[:, None]
        return y.reshape(n, f, ho, wo)

    def backward(self, g: Array) -> Sequence[Array | None]:
        x, w = self.inputs[0], self.inputs[1]
        f, c, kh, kw = w.value.shape
        n = g.shape[0]
        g2 = g.reshape(n, f, g.shape[2] * g.shape[3])  # explicit sizes: an empty batch reshapes too
        cols = self.cols.reshape(n, c * kh * kw, g2.shape[2])
        dw = (g2 @ cols.transpose(0, 2, 1)).sum(axis=0).reshape(w.value.shape)
        dx = None
        if x.requires_grad:
            dcols = (w.value.reshape(f, -1).T @ g2).reshape(self.cols.shape)
            dx = _unwindows(dcols, x.value.shape, self.stride, self.pad, self.dilation)
        grads: list[Array | None] = [dx, dw]
        if len(self.inputs) == 3:
            grads.append(g.sum(axis=(0, 2, 3)))
        return grads


class Pool2D(Op):
    """Max or average over windows; max routes the gradient to the (first) largest input, average
    spreads it evenly (padding counts as -inf for max and as 0 for average). Both walk the kh x kw
    window offsets as strided views of the input with a running max or sum, so no
    (N, C, kh, kw, Ho, Wo) window array is built; the backward pass finds each window's first max
    by comparing again (boolean masks multiply fast where numpy's masked copies are ~10x slower)."""

    def __init__(self, x: Node, mode: str, kernel: Pair, stride: Pair, pad: Pair) -> None:
        super().__init__(x, name=f"{mode}_pool2d")
        self.mode, self.kernel, self.stride, self.pad = mode, kernel, stride, pad

    def _offsets(self, x: Array) -> list[tuple[int, tuple[slice, ...]]]:
        """(offset number, the strided view index of that window offset), row-major."""
        (kh, kw), (sh, sw) = self.kernel, self.stride
        _, _, h, w = x.shape
        ho, wo = output_size(h, kh, sh, 0), output_size(w, kw, sw, 0)
        return [(i * kw + j, (slice(None), slice(None), slice(i, i + sh * (ho - 1) + 1, sh),
                              slice(j, j + sw * (wo - 1) + 1, sw))) for i in range(kh) for j in range(kw)]

    def forward(self, x: Array) -> Array:
        xp = B.array_module(x)
        ph, pw = self.pad
        if ph or pw:
            x = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)),
                       constant_values=-xp.inf if self.mode == "max" else 0.0)
        self.padded = x
        offsets = self._offsets(x)
        out = x[offsets[0][1]].copy()
        for _, view in offsets[1:]:
            if self.mode == "max":
                xp.maximum(out, x[view], out=out)
            else:
                out += x[view]
        if self.mode != "max":
            out *= 1.0 / len(offsets)
        return out

    def backward(self, g: Array) -> Sequence[Array]:
        xp = B.array_module(g)
        n, c, h, w = self.inputs[0].value.shape
        (ph, pw), x = self.pad, self.padded
        (kh, kw), (ho, wo) = self.kernel, g.shape[2:]
        tiles = self.stride == self.kernel and ho * kh == x.shape[2] and wo * kw == x.shape[3]
        dx = (xp.empty if tiles else xp.zeros)(x.shape, dtype=g.dtype)  # tiles: every input in one window
        taken = xp.zeros(g.shape, dtype=bool) if self.mode == "max" else None
        share = g * (1.0 / (kh * kw)) if self.mode != "max" else g
        for _, view in self._offsets(x):
            if taken is not None:  # the first offset holding the max takes the gradient (ties: one only)
                hit = x[view] == self.value
                hit &= ~taken
                taken |= hit
                share = g * hit
            if tiles:
                dx[view] = share
            else:
                dx[view] += share
        return (dx[:, :, ph:ph + h, pw:pw + w],)


__all__ = ["Conv2D", "IN_PLACE", "Pool2D", "output_size"]
