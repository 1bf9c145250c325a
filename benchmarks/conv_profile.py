"""Where a CNN training step's time goes: forward and backward of every op in the LeNet-5 step
(batch 64, float32), each op timed on its own over many steps, beside the whole step, PyTorch's
step (when installed) and the GEMM floor of the step's FLOPs, all in one run.

    python benchmarks/conv_profile.py [--steps 50] [--algorithm auto|gemm|winograd|fft] [--case lenet5|cifar]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does


from conv import best, cifar_layer, gemm_floor, lenet, ours, torch_step  # benchmarks/ is the script's folder


def instrument(ops) -> dict[str, list[float]]:
    """Wrap every op's forward and backward with a timer; returns {row label: [seconds, ...]}."""
    times: dict[str, list[float]] = defaultdict(list)
    for index, op in enumerate(ops):
        label = f"{index:>2} {op.name}{_algorithm_of(op)}"
        for phase in ("forward", "backward"):
            inner = getattr(op, phase)

            def timed(*args, _inner=inner, _key=f"{label} {phase}"):
                start = time.perf_counter()
                out = _inner(*args)
                times[_key].append(time.perf_counter() - start)
                return out
            setattr(op, phase, timed)
    return times


def _algorithm_of(op) -> str:
    runner = getattr(op, "runner", None)
    return f" [{runner.name}]" if runner else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--algorithm", default="auto", help="every conv layer's algorithm (auto: timed)")
    parser.add_argument("--case", choices=("lenet5", "cifar"), default="lenet5",
                        help="the LeNet-5 step (batch 64) or the CIFAR-sized 3x3 layer (batch 32)")
    args = parser.parse_args()
    # the CPU in float32: the backend outside any run
    layers, shape, batch, loss = lenet() if args.case == "lenet5" else cifar_layer()
    step, chosen, flops = ours(layers, shape, batch, loss, args.algorithm)
    print("convolutions:", chosen)
    whole = best(step, args.steps)
    graph = _graph_of(step)
    step()
    times = instrument(graph.ops)
    for _ in range(args.steps):
        step()
    total = 0.0
    print(f"{'op':<44} {'ms':>7} {'share':>6}")
    rows = sorted(((min(ts), key) for key, ts in times.items()), key=lambda r: r[1])
    for seconds, key in rows:
        total += seconds
        print(f"{key:<44} {seconds * 1e3:>7.3f} {seconds / whole:>6.1%}")
    print(f"{'sum of ops (best of each)':<44} {total * 1e3:>7.3f}")
    print(f"{'whole step':<44} {whole * 1e3:>7.3f}")
    print(f"{'GEMM floor of the step FLOPs':<44} {gemm_floor(flops, args.steps) * 1e3:>7.3f}")
    torch = torch_step(args.case, batch)
    if torch:
        t = best(torch, args.steps)
        print(f"{'PyTorch CPU step':<44} {t * 1e3:>7.3f}   ours/torch {whole / t:.2f}")


def _graph_of(step):
    """The training graph of the network a `conv.ours` step closure trains."""
    for cell in step.__closure__:
        net = cell.cell_contents
        if hasattr(net, "train_graph"):
            return net.train_graph
    raise RuntimeError("no network in the step closure")


if __name__ == "__main__":
    main()
