"""Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray, 2016) for 3x3, stride-1, undilated
convolutions: each 4x4 input tile d and 3x3 kernel g give a 2x2 output tile Y = A^T [(G g G^T) . (B^T d B)] A,
16 multiplications instead of 36; the channel sums become 16 GEMMs of (tiles, C) @ (C, F).
It computes channels-last (N, H, W, C), so every transform step is additions over views whose
innermost run is a whole pixel's channels (no per-tile loops); backward applies the transposes in
reverse order. Its output is an NCHW view of channels-last memory."""

from __future__ import annotations

import numpy as np

from ... import backend as B
from ..node import Array
from .geometry import Geometry

G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def _input_transform(r0: Array, r1: Array, r2: Array, r3: Array) -> tuple[Array, ...]:
    """B^T applied along one axis: the rows [d0 - d2, d1 + d2, d2 - d1, d1 - d3]."""
    return r0 - r2, r1 + r2, r2 - r1, r1 - r3


def _input_adjoint(v0: Array, v1: Array, v2: Array, v3: Array) -> tuple[Array, ...]:
    """B applied along one axis (the transpose of `_input_transform`)."""
    return v0, v1 - v2 + v3, v1 + v2 - v0, -v3


def _output_transform(m0: Array, m1: Array, m2: Array, m3: Array) -> tuple[Array, Array]:
    """A^T applied along one axis: [m0 + m1 + m2, m1 - m2 - m3]."""
    return m0 + m1 + m2, m1 - m2 - m3


def _output_adjoint(d0: Array, d1: Array) -> tuple[Array, ...]:
    """A applied along one axis (the transpose of `_output_transform`)."""
    return d0, d0 + d1, d0 - d1, -d1


class Winograd:
    name = "winograd"

    @staticmethod
    def supports(geometry: Geometry) -> bool:
        return geometry.kernel == (3, 3) and geometry.unit_stride and geometry.dilation == (1, 1)

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self._g = B.current().xp.asarray(G, dtype=B.current().floatx)  # G where the run's arrays live, once

    def _transform_matrix(self, like: Array) -> Array:
        """G in the arrays' module and type (copied to the device on first use only)."""
        if self._g.dtype != like.dtype or not isinstance(self._g, type(like)):
            self._g = B.array_module(like).asarray(G, dtype=like.dtype)
        return self._g

    def _tiles(self, h: int, w: int) -> tuple[int, int, int, int]:
        ho, wo = self.geometry.output_hw(h, w)
        return ho, wo, (ho + 1) // 2, (wo + 1) // 2

    def forward(self, x: Array, w: Array, b: Array | None) -> Array:
        xp = B.array_module(x)
        n, c, h, wd = self.x_shape = x.shape
        f = w.shape[0]
        ho, wo, th, tw = self._tiles(h, wd)
        (ph, pw) = self.geometry.pad
        xh = xp.zeros((n, 2 * th + 2, 2 * tw + 2, c), dtype=x.dtype)   # padded, channels last
        xh[:, ph:ph + h, pw:pw + wd] = x.transpose(0, 2, 3, 1)
        v = xp.empty((4, 4, n, th, tw, c), dtype=x.dtype)
        for a, rows in enumerate(_input_transform(*(xh[:, k:k + 2 * th:2] for k in range(4)))):
            v[a] = xp.stack(_input_transform(*(rows[:, :, k:k + 2 * tw:2] for k in range(4))))
        self.v = B.operand(v.reshape(16, -1, c))
        self.u = B.operand(self._kernel_transform(w).reshape(16, c, f))
        m = (self.v @ self.u).reshape(4, 4, n, th, tw, f)
        y = xp.empty((n, th, 2, tw, 2, f), dtype=x.dtype)
        for r, row in enumerate(_output_transform(*m)):
            y[:, :, r, :, 0], y[:, :, r, :, 1] = _output_transform(*row)
        y = y.reshape(n, 2 * th, 2 * tw, f)[:, :ho, :wo]
        if b is not None:
            y += b
        return y.transpose(0, 3, 1, 2)

    def _kernel_transform(self, w: Array) -> Array:
        """U = G w G^T for every (channel, filter): (4, 4, C, F)."""
        g = self._transform_matrix(w)
        return B.array_module(w).einsum("ai,fcij,bj->abcf", g, w, g)

    def backward(self, g: Array, w: Array, need_dx: bool) -> tuple[Array | None, Array, Array]:
        xp = B.array_module(g)
        n, c, h, wd = self.x_shape
        f = w.shape[0]
        ho, wo, th, tw = self._tiles(h, wd)
        gh = xp.zeros((n, th, 2, tw, 2, f), dtype=g.dtype)
        gh.reshape(n, 2 * th, 2 * tw, f)[:, :ho, :wo] = g.transpose(0, 2, 3, 1)
        dm = xp.empty((4, 4, n, th, tw, f), dtype=g.dtype)
        for a, rows in enumerate(_output_adjoint(gh[:, :, 0], gh[:, :, 1])):
            dm[a] = xp.stack(_output_adjoint(rows[:, :, :, 0], rows[:, :, :, 1]))
        dm = B.operand(dm.reshape(16, -1, f))
        du = (self.v.transpose(0, 2, 1) @ dm).reshape(4, 4, c, f)
        gm = self._transform_matrix(g)
        dw = xp.einsum("ai,abcf,bj->fcij", gm, du, gm)
        db = gh.sum(axis=(0, 1, 2, 3, 4))
        dx = self._input_gradient(dm @ self.u.transpose(0, 2, 1)) if need_dx else None
        return dx, dw, db

    def _input_gradient(self, dv: Array) -> Array:
        """Scatter B dV B^T of every tile back onto the (overlapping) 4x4 input windows."""
        xp = B.array_module(dv)
        n, c, h, wd = self.x_shape
        _, _, th, tw = self._tiles(h, wd)
        (ph, pw) = self.geometry.pad
        dv = dv.reshape(4, 4, n, th, tw, c)
        dx = xp.zeros((n, 2 * th + 2, 2 * tw + 2, c), dtype=dv.dtype)
        for r, row in enumerate(_input_adjoint(*dv)):
            for s, tile in enumerate(_input_adjoint(*row)):
                dx[:, r:r + 2 * th:2, s:s + 2 * tw:2] += tile
        return dx[:, ph:ph + h, pw:pw + wd].transpose(0, 3, 1, 2)
