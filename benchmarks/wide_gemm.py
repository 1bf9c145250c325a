"""A small matrix times a wide one (a convolution's filters times its windows), as one GEMM and as
`matmul_wide` cuts it (pieces of at most SMALL_GEMM / (M K) columns, which OpenBLAS runs by its
small-matrix kernel where that pays: on one BLAS thread, or for fewer than 8 rows): median times of
interleaved repeats and their ratio, per shape, in one run. Run it as the ranks run (one thread) and
as one process does (all cores):

    OPENBLAS_NUM_THREADS=1 python benchmarks/wide_gemm.py [--repeats 9] [--dtype float32]
    python benchmarks/wide_gemm.py
"""

from __future__ import annotations

import argparse
import time

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does
import numpy as np

from magmadnn_cli.core import blas
from magmadnn_cli.core.graph.convolution.geometry import matmul_wide

# (what it is, M, K, N): the forward GEMM (filters x C*kh*kw) or input-gradient GEMM (C*kh*kw x filters)
SHAPES = (
    ("LeNet-5 conv1 forward, 32 rows (a rank of 2)", 6, 25, 32 * 28 * 32),
    ("LeNet-5 conv1 forward, 64 rows", 6, 25, 64 * 28 * 32),
    ("3x3, 1 -> 16 channels, 16x16 maps, 100 rows", 16, 9, 100 * 16 * 18),
    ("3x3, 1 -> 32 channels, 28x28 maps, 32 rows", 32, 9, 32 * 28 * 30),
    ("3x3, 3 -> 16 channels, 32x32 maps, 32 rows", 16, 27, 32 * 32 * 34),
    ("3x3 input gradient, 4 <- 8 channels, 28x28, 32 rows", 36, 8, 32 * 28 * 30),
    ("5x5, 3 -> 32 channels (one GEMM: pieces too short)", 32, 75, 32 * 28 * 32),
)


def seconds(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"BLAS threads: {blas.get_threads()}, {args.dtype}")
    print(f"{'GEMM':<54} {'M x K x N':>16} {'one ms':>8} {'pieces ms':>10} {'ratio':>6}")
    for name, m, k, n in SHAPES:
        a, b = rng.random((m, k)).astype(args.dtype), rng.random((k, n)).astype(args.dtype)
        calls = max(3, int(4e7 / (m * k * n)))
        whole, pieces = [], []
        for _ in range(args.repeats):  # interleaved: a slow spell of the machine hits both
            whole.append(seconds(lambda: a @ b, calls))
            pieces.append(seconds(lambda: matmul_wide(a, b), calls))
        w, p = float(np.median(whole)), float(np.median(pieces))
        print(f"{name:<54} {f'{m}x{k}x{n}':>16} {w * 1e3:>8.3f} {p * 1e3:>10.3f} {p / w:>6.2f}")


if __name__ == "__main__":
    main()
