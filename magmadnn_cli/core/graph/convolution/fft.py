"""Convolution through the FFT (the convolution theorem; Mathieu et al., 2014) for stride-1
layers, any kernel size, padding and dilation (a dilated kernel is a sparse larger one). The
channel sums are complex GEMMs per frequency; its cost barely grows with the kernel, so it pays
for large kernels on large maps."""

from __future__ import annotations

from ... import backend as B
from ..node import Array
from .geometry import Geometry, as_nchw, channel_major, crop


class FFT:
    name = "fft"

    @staticmethod
    def supports(geometry: Geometry) -> bool:
        return geometry.unit_stride

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry

    def _kernel(self, w: Array) -> Array:
        """The kernel with the dilation's zeros in place: (F, C, dilated kh, dilated kw)."""
        (dh, dw), (kh, kw) = self.geometry.dilation, self.geometry.dilated_kernel
        if (dh, dw) == (1, 1):
            return w
        full = B.array_module(w).zeros((*w.shape[:2], kh, kw), dtype=w.dtype)
        full[:, :, ::dh, ::dw] = w
        return full

    def forward(self, x: Array, w: Array, b: Array | None) -> Array:
        xp = B.array_module(x)
        n, c, h, wd = self.x_shape = x.shape
        ho, wo = self.geometry.output_hw(h, wd)
        xc = channel_major(x, self.geometry.pad)
        self.size = xc.shape[2:]
        self.xf = xp.fft.rfft2(xc)                                      # (C, N, Hp, Wp/2+1)
        self.wf = xp.fft.rfft2(self._kernel(w), s=self.size)            # (F, C, Hp, Wp/2+1)
        yf = _channel_sum(xp.conj(self.wf), self.xf)                   # correlation: x * conj(w)
        y = xp.fft.irfft2(yf, s=self.size)[:, :, :ho, :wo].astype(x.dtype, copy=False)
        if b is not None:
            y += b[:, None, None, None]
        return as_nchw(y)

    def backward(self, g: Array, w: Array, need_dx: bool) -> tuple[Array | None, Array, Array]:
        xp = B.array_module(g)
        n, c, h, wd = self.x_shape
        (dh, dw), (kh, kw) = self.geometry.dilation, self.geometry.dilated_kernel
        gc = g.transpose(1, 0, 2, 3)
        gf = xp.fft.rfft2(gc, s=self.size)                              # (F, N, Hp, Wp/2+1)
        kernel_f = _channel_sum(gf, xp.conj(self.xf).transpose(1, 0, 2, 3))  # sum_n G[f, n] conj(X[c, n])
        kernel_grad = xp.fft.irfft2(xp.conj(kernel_f), s=self.size)[:, :, :kh:dh, :kw:dw].astype(g.dtype)
        db = gc.sum(axis=(1, 2, 3))
        dx = None
        if need_dx:
            dxf = _channel_sum(self.wf.transpose(1, 0, 2, 3), gf)        # sum_f W[f, c] G[f, n]
            dx = xp.fft.irfft2(dxf, s=self.size).astype(g.dtype, copy=False)
            dx = as_nchw(crop(dx, self.geometry.pad, h, wd))
        return dx, kernel_grad, db


def _channel_sum(a: Array, b: Array) -> Array:
    """out[p, q] = sum_k a[p, k] * b[k, q] at every frequency: (P, K, f...) x (K, Q, f...) -> (P, Q, f...)."""
    p, k = a.shape[:2]
    q = b.shape[1]
    freq = a.shape[2:]
    a2 = a.reshape(p, k, -1).transpose(2, 0, 1)
    b2 = b.reshape(k, q, -1).transpose(2, 0, 1)
    return (a2 @ b2).transpose(1, 2, 0).reshape(p, q, *freq)
