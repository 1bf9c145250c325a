"""Dropout masks: the counter-based generator (keyed by sample position, what makes N ranks draw
what one process draws) against numpy's sequential Generator, for the paper MLP's hidden layer
(batch 100 x 528) and a conv activation (batch 64 x 16 x 28 x 28), timed in turns in one run.

    python benchmarks/dropout.py
"""

from __future__ import annotations

import time

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does
import numpy as np

from magmadnn_cli.core.counter_random import keep_mask


def best_us(fn, repeats: int = 5, calls: int = 50) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'shape':<22} {'counter-based us':>16} {'numpy Generator us':>19} {'ratio':>6}")
    for shape in ((100, 528), (64, 16, 28, 28)):
        positions = np.arange(shape[0])
        scale = np.float32(1 / 0.8)
        ours = best_us(lambda: keep_mask(7, positions, shape, 0.2, np.float32))
        theirs = best_us(lambda: (rng.random(shape, dtype=np.float32) >= 0.2) * scale)
        print(f"{str(shape):<22} {ours:>16.0f} {theirs:>19.0f} {ours / theirs:>6.2f}")


if __name__ == "__main__":
    main()
