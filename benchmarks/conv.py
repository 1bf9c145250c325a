"""Convolution speed: forward + backward of (a) the LeNet-5 training step on MNIST-shaped batches and
(b) one CIFAR-sized conv layer (batch 32, 3 -> 64 channels, 32x32, 3x3 same), each with every
algorithm forced and with the autotuned choice, beside a pure GEMM floor of the same FLOPs and, when
installed, PyTorch on the CPU, all measured in this run. Ours and PyTorch are timed in alternating
rounds (this VM's speed drifts by 2x within minutes): the ratio of the best times, and the median of
the rounds' ratios.

    python benchmarks/conv.py [--steps 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does
import numpy as np

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
    return ([Conv2D.of(filters=6, kernel_size=5, padding="same", activation="relu"), Pool2D.of(mode="max", pool_size=2), Conv2D.of(filters=16, kernel_size=5, activation="relu"),
             Pool2D.of(mode="max", pool_size=2), Flatten.of(), Dense.of(units=120, activation="relu"), Dense.of(units=84, activation="relu"), Dense.of(units=10, activation="softmax")],
            (1, 28, 28), batch, CrossEntropy())


def cifar_layer(batch: int = 32):
    return [Conv2D.of(filters=64, kernel_size=3, padding="same")], (3, 32, 32), batch, MeanSquaredError()


def ours(layers, shape, batch, loss, algorithm: str = "auto"):
    """One training step's closure, the network's conv algorithms and the step's FLOPs."""
    for layer in layers:
        if isinstance(layer, Conv2D):
            layer.algorithm = algorithm
    net = Network(layers, shape, loss, seed=0)
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, 10, batch) if isinstance(loss, CrossEntropy) else \
        rng.random((batch, *net.output_shape), dtype=np.float32)
    net.tune_convolutions(x)
    flops = 3 * batch * sum(layer.flops() for layer in layers)
    return (lambda: net.forward_backward(x, y)), net.conv_algorithms(), flops


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


def rounds(ours_step, torch_step_, steps: int, count: int) -> tuple[float, float | None, float | None]:
    """Best seconds of ours, of PyTorch, and the median ratio of rounds timed back to back."""
    pairs = [(best(ours_step, steps, 1), best(torch_step_, steps, 1) if torch_step_ else None) for _ in range(count)]
    mine = min(p[0] for p in pairs)
    if torch_step_ is None:
        return mine, None, None
    return mine, min(p[1] for p in pairs), float(np.median([a / b for a, b in pairs]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # the CPU in float32: the backend outside any run
    print(f"{'case':<34} {'ours ms':>8} {'floor ms':>9} {'ours/floor':>10} {'torch ms':>9} {'best/best':>9} "
          f"{'median of rounds':>16}")
    for name, build in (("lenet5", lenet), ("cifar_conv", cifar_layer)):
        for algorithm in ("auto", "gemm", "winograd", "fft"):
            layers, shape, batch, loss = build()
            step, chosen, flops = ours(layers, shape, batch, loss, algorithm)
            if algorithm != "auto" and algorithm not in chosen.values():
                continue  # no layer of this case can run it
            t_ours, t_torch, ratio = rounds(step, torch_step(name, batch), args.steps, args.rounds)
            t_floor = gemm_floor(flops, args.steps)
            label = f"{name} {algorithm}" + (f" ({'/'.join(chosen.values())})" if algorithm == "auto" else "")
            extra = f"{t_torch * 1e3:>9.2f} {t_ours / t_torch:>9.2f} {ratio:>16.2f}" if t_torch else f"{'-':>9}"
            print(f"{label:<34} {t_ours * 1e3:>8.2f} {t_floor * 1e3:>9.2f} {t_ours / t_floor:>10.2f} {extra}")


if __name__ == "__main__":
    main()
