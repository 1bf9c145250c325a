"""The MagmaDNN paper's MLP benchmark: 784 -> L x 528 sigmoid -> 10 softmax, batch 100, SGD lr 0.05,
weight decay 0.001, on MNIST-shaped random data. Times full training steps of our engine beside a
GEMM-only floor (the same matmuls, nothing else) in the same run and prints engine / floor.

    python benchmarks/mlp_step.py [--device cpu|gpu] [--steps 50] [--layers 1 2 3 4]
"""

from __future__ import annotations

import argparse
import time

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does
import numpy as np

from magmadnn_cli.core import backend as B
from magmadnn_cli.nn.layers import Dense
from magmadnn_cli.nn.losses import CrossEntropy
from magmadnn_cli.nn.network import Network
from magmadnn_cli.nn.optimizers import SGD

BATCH, INPUTS, HIDDEN, CLASSES = 100, 784, 528, 10


def best_times(fns, steps: int, repeats: int = 5) -> list[float]:
    """Seconds per call of each function: the best of `repeats` timings of `steps` calls, the
    functions taking turns, so that a slow spell of the machine hits all of them alike."""
    for fn in fns:
        fn()
    B.synchronize()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            B.synchronize()
            best[i] = min(best[i], (time.perf_counter() - start) / steps)
    return best


def engine_step(layers: int):
    xp = B.current().xp
    net = Network([Dense.of(units=HIDDEN, activation="sigmoid") for _ in range(layers)] + [Dense.of(units=CLASSES, activation="softmax")],
                  (INPUTS,), CrossEntropy(), seed=0)
    opt = SGD.of(learning_rate=0.05, weight_decay=0.001)
    rng = np.random.default_rng(0)
    x = B.to_device(rng.random((BATCH, INPUTS), dtype=np.float32))
    y = B.to_device(rng.integers(0, CLASSES, BATCH))
    _ = xp

    def step() -> None:
        net.forward_backward(x, y)
        opt.step(net.flat_params, net.flat_grads)
    return step


def gemm_floor(layers: int):
    """Forward: one GEMM per layer. Backward: dW = h^T dz per layer, dh = dz W^T except the first."""
    xp = B.current().xp
    widths = [INPUTS] + [HIDDEN] * layers + [CLASSES]
    ws = [xp.asarray(np.random.default_rng(i).random((a, b), dtype=np.float32)) for i, (a, b) in enumerate(zip(widths, widths[1:]))]
    hs = [xp.asarray(np.random.default_rng(9).random((BATCH, w), dtype=np.float32)) for w in widths]
    dws = [xp.empty_like(w) for w in ws]

    def step() -> None:
        for i, w in enumerate(ws):
            xp.matmul(hs[i], w, out=hs[i + 1])
        dz = hs[-1]
        for i in reversed(range(len(ws))):
            xp.matmul(hs[i].T, dz, out=dws[i])
            if i:
                dz = dz @ ws[i].T
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3, 4])
    args = parser.parse_args()
    with B.using(B.select(args.device)):
        print(f"device={B.current().device} batch={BATCH} 784 -> L x {HIDDEN} sigmoid -> 10, SGD lr 0.05 wd 0.001")
        print(f"{'L':>2} {'engine ms':>10} {'floor ms':>9} {'ratio':>6} {'samples/s':>10}")
        for layers in args.layers:
            engine, floor = best_times([engine_step(layers), gemm_floor(layers)], args.steps)
            print(f"{layers:>2} {engine * 1e3:>10.3f} {floor * 1e3:>9.3f} {engine / floor:>6.2f} {BATCH / engine:>10.0f}")


if __name__ == "__main__":
    main()
