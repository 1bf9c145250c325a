"""Convolution speed: forward + backward of (a) the LeNet-5 training step on MNIST-shaped batches and
(b) one CIFAR-sized conv layer (batch 32, 3 -> 64 channels, 32x32, 3x3 same), each beside a pure GEMM
floor of the same FLOPs and, when installed, PyTorch on the CPU, all measured in this run.

    python benchmarks/conv.py [--steps 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from magmadnn_cli.core import backend as B
from magmadnn_cli.nn.layers import Conv2D, Dense, Flatten, Pool2D
from magmadnn_cli.nn.losses import CrossEntropy, MeanSquaredError
from magmadnn_cli.nn.network import Network


def best(fn, steps: int, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        times.append((time.perf_counter() - start) / steps)
    return min(times)


def gemm_floor(flops: float, steps: int) -> float:
    """A square float32 GEMM with the same FLOPs (forward + backward = 3x the forward FLOPs)."""
    n = max(8, int(round((flops / 2) ** (1 / 3))))
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    return best(lambda: a @ a, steps) * flops / (2 * n ** 3)


def lenet(batch: int = 64):
    return ([Conv2D(6, 5, padding="same", activation="relu"), Pool2D("max", 2), Conv2D(16, 5, activation="relu"),
             Pool2D("max", 2), Flatten(), Dense(120, "relu"), Dense(84, "relu"), Dense(10, "softmax")],
            (1, 28, 28), batch, CrossEntropy())


def cifar_layer(batch: int = 32):
    return [Conv2D(64, 3, padding="same")], (3, 32, 32), batch, MeanSquaredError()


def ours(layers, shape, batch, loss):
    net = Network(layers, shape, loss, seed=0)
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, 10, batch) if isinstance(loss, CrossEntropy) else \
        rng.random((batch, *net.output_shape), dtype=np.float32)
    flops = 3 * batch * sum(layer.flops() for layer in layers)
    return (lambda: net.forward_backward(x, y)), flops


def torch_step(name: str, batch: int):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(max(1, torch.get_num_threads()))
    nn = torch.nn
    if name == "lenet5":
        model = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                              nn.ReLU(), nn.Linear(84, 10))
        x, y = torch.rand(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        loss_fn = nn.functional.cross_entropy
    else:
        model = nn.Conv2d(3, 64, 3, padding=1)
        x = torch.rand(batch, 3, 32, 32)
        y = torch.rand(batch, 64, 32, 32)
        loss_fn = nn.functional.mse_loss

    def step() -> None:
        model.zero_grad()
        loss_fn(model(x), y).backward()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    B.select("cpu")
    print(f"{'case':<28} {'ours ms':>8} {'floor ms':>9} {'ours/floor':>10} {'torch ms':>9} {'ours/torch':>10}")
    for name, (layers, shape, batch, loss) in (("lenet5", lenet()), ("cifar_conv", cifar_layer())):
        step, flops = ours(layers, shape, batch, loss)
        t_ours, t_floor = best(step, args.steps), gemm_floor(flops, args.steps)
        t_torch = torch_step(name, batch)
        torch_ms = best(t_torch, args.steps) if t_torch else None
        label = f"{name} (batch {batch})"
        extra = f"{torch_ms * 1e3:>9.2f} {t_ours / torch_ms:>10.2f}" if torch_ms else f"{'-':>9} {'-':>10}"
        print(f"{label:<28} {t_ours * 1e3:>8.2f} {t_floor * 1e3:>9.2f} {t_ours / t_floor:>10.2f} {extra}")


if __name__ == "__main__":
    main()
