"""A convolution's geometry (kernel, stride, padding, dilation) and the array helpers its
algorithms share. Arrays are logical NCHW; the algorithms compute in channel-major (C, N, H, W)
memory and hand back NCHW *views* of it, so a layer's output keeps that memory order through
activations and pooling (numpy and cupy keep a view's order) and the next convolution reads it
without a transpose."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import backend as B
from ... import blas
from ..node import Array

Pair = tuple[int, int]


def output_size(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


@dataclass(frozen=True)
class Geometry:
    kernel: Pair
    stride: Pair = (1, 1)
    pad: Pair = (0, 0)
    dilation: Pair = (1, 1)

    def output_hw(self, h: int, w: int) -> Pair:
        return (output_size(h, self.kernel[0], self.stride[0], self.pad[0], self.dilation[0]),
                output_size(w, self.kernel[1], self.stride[1], self.pad[1], self.dilation[1]))

    @property
    def unit_stride(self) -> bool:
        return self.stride == (1, 1)

    @property
    def dilated_kernel(self) -> Pair:
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilation))  # type: ignore[return-value]


def channel_major(x: Array, pad: Pair = (0, 0)) -> Array:
    """(N, C, H, W) -> (C, N, H + 2ph, W + 2pw) with zero padding; a view when nothing is padded."""
    xc = x.transpose(1, 0, 2, 3)
    (ph, pw) = pad
    if not (ph or pw):
        return xc
    return B.array_module(x).pad(xc, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def as_nchw(yc: Array) -> Array:
    """The (N, C, H, W) view of a channel-major (C, N, H, W) array."""
    return yc.transpose(1, 0, 2, 3)


def crop(xc: Array, pad: Pair, h: int, w: int) -> Array:
    """The unpadded (C, N, h, w) region of a padded channel-major array, as a view."""
    return xc[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + w]


SMALL_GEMM = 1_000_000  # M x N x K up to which OpenBLAS runs a GEMM by its unpacked small-matrix kernel
MIN_PIECE = 1024  # fewer columns a piece: the calls' overhead outweighs the faster kernel
FEW_ROWS = 8  # fewer rows than this: OpenBLAS's threaded packed kernel is slow too


def matmul_wide(a: Array, b: Array) -> Array:
    """a @ b for a small (M, K) and a wide (K, N), e.g. a convolution's filters times its windows.
    On the CPU, b is cut into pieces of at most SMALL_GEMM / (M K) columns, which OpenBLAS multiplies
    by its small-matrix kernel (here bit-identical to the whole product) where that is faster:
    on one BLAS thread (each data-parallel rank's) 1.1-2.9x; on more, only for fewer than FEW_ROWS
    rows, the threaded whole being faster otherwise (benchmarks/wide_gemm.py)."""
    (m, k), n = a.shape, b.shape[1]
    piece = SMALL_GEMM // max(1, m * k) // 16 * 16
    if B.array_module(a) is not np or piece < MIN_PIECE or n <= piece or (m >= FEW_ROWS and blas.get_threads() != 1):
        return a @ b
    out = np.empty((m, n), dtype=np.result_type(a, b))
    for lo in range(0, n, piece):
        np.matmul(a, b[:, lo:lo + piece], out=out[:, lo:lo + piece])
    return out


def matmul_nt(a: Array, b: Array, chunk: int = 2048) -> Array:
    """a @ b.T for (P, M) and (Q, M) with a long M. On the CPU the larger of P and Q goes first and
    M is cut into a batch of GEMMs that are summed: OpenBLAS is slow on one GEMM with a long inner
    dimension and a tiny output (docs/performance.md, "Why the code is shaped so")."""
    if B.array_module(a) is not np:
        return a @ b.T
    if a.shape[0] < b.shape[0]:
        return matmul_nt(b, a, chunk).T
    m = a.shape[1]
    pieces = m // chunk
    if pieces < 2:
        return a @ b.T
    head = pieces * chunk
    out = np.matmul(a[:, :head].reshape(a.shape[0], pieces, chunk).transpose(1, 0, 2),
                    b[:, :head].reshape(b.shape[0], pieces, chunk).transpose(1, 2, 0)).sum(axis=0)
    if head < m:
        out += a[:, head:] @ b[:, head:].T
    return out
