"""The measurements behind `conv_algorithm: auto`'s fixed rule (`convolution.rule`): for a grid of
3x3 stride-1 layers (channels in and out, map size, batch) it times one forward + backward of every
algorithm that can run the layer, best of a few, and prints each geometry's fastest beside the rule's
choice and the time the rule's choice costs over the fastest. The rule must never pick a slow path
and be near the fastest where the timings are clear (this VM's speed drifts: run it twice).

    python benchmarks/conv_rule.py [--batch 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does
import numpy as np

from magmadnn_cli.core.graph.convolution import Geometry, rule, time_algorithms

CHANNELS = (1, 3, 8, 16, 32, 64)
SIZES = (8, 16, 28)


def measure(c_in: int, c_out: int, size: int, batch: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, c_in, size, size)).astype(np.float32)
    w = rng.normal(size=(c_out, c_in, 3, 3)).astype(np.float32)
    return time_algorithms(Geometry((3, 3), pad=(1, 1)), x, w, None, True, repeats)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # the CPU in float32: the backend outside any run
    print(f"{'in':>3} {'out':>3} {'map':>4} | {'gemm ms':>8} {'winograd ms':>11} {'fft ms':>7} | fastest  rule     cost")
    costs = []
    for c_in, c_out, size in itertools.product(CHANNELS, CHANNELS, SIZES):
        times = measure(c_in, c_out, size, args.batch, args.repeats)
        fastest = min(times, key=times.__getitem__)
        chosen = rule(Geometry((3, 3), pad=(1, 1)), c_in, c_out)
        costs.append(times[chosen] / times[fastest])
        print(f"{c_in:>3} {c_out:>3} {size:>4} | {times['gemm'] * 1e3:8.2f} {times['winograd'] * 1e3:11.2f} "
              f"{times['fft'] * 1e3:7.2f} | {fastest:8} {chosen:8} {costs[-1]:.2f}x")
    print(f"rule vs fastest: median {np.median(costs):.2f}x, worst {max(costs):.2f}x over {len(costs)} layers")


if __name__ == "__main__":
    main()
