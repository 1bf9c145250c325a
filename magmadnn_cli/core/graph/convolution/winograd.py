"""Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray, 2016) for 3x3, stride-1, undilated
convolutions: each 4x4 input tile d and 3x3 kernel g give a 2x2 output tile Y = A^T [(G g G^T) . (B^T d B)] A,
16 multiplications instead of 36; the channel sums become 16 GEMMs of (F, C) @ (C, tiles).
The transforms are a few additions over strided views (no per-tile loops); backward passes apply
their transposes in reverse order."""

from __future__ import annotations

import numpy as np

from ... import backend as B
from ..node import Array
from .geometry import Geometry, as_nchw, channel_major, crop

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

    def forward(self, x: Array, w: Array, b: Array | None) -> Array:
        xp = B.array_module(x)
        n, c, h, wd = self.x_shape = x.shape
        f = w.shape[0]
        ho, wo = self.geometry.output_hw(h, wd)
        th, tw = (ho + 1) // 2, (wo + 1) // 2
        self.tiles = (th, tw)
        xc = channel_major(x, self.geometry.pad, (2 * th + 2 - (ho + 2), 2 * tw + 2 - (wo + 2)))
        rows = _input_transform(*(xc[:, :, k:k + 2 * th:2] for k in range(4)))
        v = xp.stack([xp.stack(_input_transform(*(r[..., k:k + 2 * tw:2] for k in range(4)))) for r in rows])
        self.v = v.reshape(16, c, n * th * tw)
        self.u = self._kernel_transform(w).reshape(16, f, c)
        m = (self.u @ self.v).reshape(4, 4, f, n, th, tw)
        y = xp.empty((f, n, th, 2, tw, 2), dtype=x.dtype)
        for a, pair in enumerate(_output_transform(*m)):
            y[:, :, :, a, :, 0], y[:, :, :, a, :, 1] = _output_transform(*pair)
        y = y.reshape(f, n, 2 * th, 2 * tw)[:, :, :ho, :wo]
        if b is not None:
            y += b[:, None, None, None]
        return as_nchw(y)

    @staticmethod
    def _kernel_transform(w: Array) -> Array:
        """U = G w G^T for every (filter, channel): (4, 4, F, C)."""
        xp = B.array_module(w)
        g = xp.asarray(G, dtype=w.dtype)
        return xp.einsum("ai,fcij,bj->abfc", g, w, g)

    def backward(self, g: Array, w: Array, need_dx: bool) -> tuple[Array | None, Array, Array]:
        xp = B.array_module(g)
        n, c, h, wd = self.x_shape
        f = w.shape[0]
        (th, tw), (ho, wo) = self.tiles, g.shape[2:]
        gc = xp.zeros((f, n, 2 * th, 2 * tw), dtype=g.dtype)
        gc[:, :, :ho, :wo] = g.transpose(1, 0, 2, 3)
        gt = gc.reshape(f, n, th, 2, tw, 2)
        rows = _output_adjoint(gt[:, :, :, 0], gt[:, :, :, 1])  # each (F, N, th, tw, 2)
        dm = xp.stack([xp.stack(_output_adjoint(r[..., 0], r[..., 1])) for r in rows]).reshape(16, f, -1)
        du = (dm @ self.v.transpose(0, 2, 1)).reshape(4, 4, f, c)
        dw = xp.einsum("ai,abfc,bj->fcij", xp.asarray(G, dtype=g.dtype), du, xp.asarray(G, dtype=g.dtype))
        db = gc.sum(axis=(1, 2, 3))
        dx = self._input_gradient(self.u.transpose(0, 2, 1) @ dm) if need_dx else None
        return dx, dw, db

    def _input_gradient(self, dv: Array) -> Array:
        """Scatter B dV B^T of every tile back onto the (overlapping) 4x4 input windows."""
        xp = B.array_module(dv)
        n, c, h, wd = self.x_shape
        th, tw = self.tiles
        (ph, pw) = self.geometry.pad
        dv = dv.reshape(4, 4, c, n, th, tw)
        dx = xp.zeros((c, n, 2 * th + 2, 2 * tw + 2), dtype=dv.dtype)
        for r, row in enumerate(_input_adjoint(*dv)):
            for s, tile in enumerate(_input_adjoint(*(row[k] for k in range(4)))):
                dx[:, :, r:r + 2 * th:2, s:s + 2 * tw:2] += tile
        return as_nchw(crop(dx, (ph, pw), h, wd))
