"""Convolution as one 2-D GEMM per pass over channel-major windows (im2col): any kernel, stride,
padding and dilation. Only the kh x kw kernel offsets are looped over, never samples or pixels.

Stride-1 layers use flat rows: each padded image is one row-major line, and kernel offset (i, j)
is the same line shifted by i*Wp + j, so its window copy (and the adjoint's add) is one long
contiguous run per image instead of Ho runs of Wo; the GEMM computes Wp - Wo extra junk columns per
output row (cut off in forward, zeroed in the gradient), which costs less than the short runs."""

from __future__ import annotations

from ... import backend as B
from ..node import Array, column_sums
from .geometry import Geometry, as_nchw, channel_major, crop, matmul_nt, matmul_wide


class Gemm:
    """y[f, (n, p)] = W[f, (c, i, j)] @ cols[(c, i, j), (n, p)], cols gathered once per step."""
    name = "gemm"

    @staticmethod
    def supports(geometry: Geometry) -> bool:
        return True

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.flat = geometry.unit_stride
        self.cols: Array | None = None
        self.row = 0  # the output rows' width in cols (Wp on the flat path: junk columns included)
        self.x_shape: tuple[int, ...] = ()

    def _shifts(self, width: int):
        """(i, j, how far kernel offset (i, j) shifts a flat padded image of this row width)."""
        (kh, kw), (dh, dw) = self.geometry.kernel, self.geometry.dilation
        return [(i, j, i * dh * width + j * dw) for i in range(kh) for j in range(kw)]

    def _windows(self, ho: int, wo: int):
        """(i, j, the (H, W) slices that kernel offset (i, j) reads for every output pixel)."""
        (kh, kw), (sh, sw), (dh, dw) = self.geometry.kernel, self.geometry.stride, self.geometry.dilation
        return [(i, j, (slice(i * dh, i * dh + sh * (ho - 1) + 1, sh), slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)))
                for i in range(kh) for j in range(kw)]

    def _padded_lines(self, x: Array) -> Array:
        """(C, N, (Hp + 1) * Wp): each padded image flat, with a spare row of zeros for the last shifts."""
        xp = B.array_module(x)
        n, c, h, w = x.shape
        (ph, pw) = self.geometry.pad
        hp, wp = h + 2 * ph, w + 2 * pw
        lines = xp.zeros((c, n, (hp + 1) * wp), dtype=x.dtype)
        lines[:, :, :hp * wp].reshape(c, n, hp, wp)[:, :, ph:ph + h, pw:pw + w] = x.transpose(1, 0, 2, 3)
        return lines

    def forward(self, x: Array, w: Array, b: Array | None) -> Array:
        xp = B.array_module(x)
        n, c, h, wd = self.x_shape = x.shape
        f, _, kh, kw = w.shape
        ho, wo = self.geometry.output_hw(h, wd)
        if self.flat:
            row = wd + 2 * self.geometry.pad[1]
            lines, run = self._padded_lines(x), ho * row
            cols = xp.empty((c, kh, kw, n, run), dtype=x.dtype)
            for i, j, shift in self._shifts(row):
                cols[:, i, j] = lines[:, :, shift:shift + run]
        else:
            row, xc = wo, channel_major(x, self.geometry.pad)
            cols = xp.empty((c, kh, kw, n, ho, wo), dtype=x.dtype)
            for i, j, (rows, columns) in self._windows(ho, wo):
                cols[:, i, j] = xc[:, :, rows, columns]
        self.cols, self.row = cols.reshape(c * kh * kw, -1), row
        self.cols = B.operand(self.cols)
        y = matmul_wide(B.operand(w.reshape(f, -1)), self.cols)
        if b is not None:
            y += b[:, None]
        return as_nchw(y.reshape(f, n, ho, row)[..., :wo])

    def backward(self, g: Array, w: Array, need_dx: bool) -> tuple[Array | None, Array, Array]:
        xp = B.array_module(g)
        f, n, (ho, wo) = w.shape[0], g.shape[0], g.shape[2:]
        gc = (xp.zeros if self.row != wo else xp.empty)((f, n, ho, self.row), dtype=g.dtype)
        gc[..., :wo] = g.transpose(1, 0, 2, 3)  # channel-major, junk columns zero
        whole = gc.reshape(f, -1)
        g2 = B.operand(whole)
        dw = matmul_nt(g2, self.cols).reshape(w.shape)
        db = column_sums(whole.T)
        dx = None
        if need_dx:  # W^T made contiguous: OpenBLAS runs faster than on its transposed view (docs/performance.md)
            dx = self._scatter(matmul_wide(xp.ascontiguousarray(B.operand(w.reshape(f, -1)).T), g2), (ho, wo))
        return dx, dw, db

    def _scatter(self, dcols: Array, out_hw: tuple[int, int]) -> Array:
        """The adjoint of the window gather: add each offset's rows back onto the input."""
        xp = B.array_module(dcols)
        n, c, h, w = self.x_shape
        (kh, kw), (ph, pw) = self.geometry.kernel, self.geometry.pad
        hp, wp = h + 2 * ph, w + 2 * pw
        if self.flat:
            run = out_hw[0] * wp
            dcols = dcols.reshape(c, kh, kw, n, run)
            lines = xp.zeros((c, n, (hp + 1) * wp), dtype=dcols.dtype)
            for i, j, shift in self._shifts(wp):
                lines[:, :, shift:shift + run] += dcols[:, i, j]
            dx = lines[:, :, :hp * wp].reshape(c, n, hp, wp)
        else:
            dcols = dcols.reshape(c, kh, kw, n, *out_hw)
            dx = xp.zeros((c, n, hp, wp), dtype=dcols.dtype)
            for i, j, (rows, columns) in self._windows(*out_hw):
                dx[:, :, rows, columns] += dcols[:, i, j]
        return as_nchw(crop(dx, (ph, pw), h, w))
