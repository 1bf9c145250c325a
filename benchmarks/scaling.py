"""Weak and strong scaling of data-parallel training on this machine (1 vs N ranks, 1 BLAS thread
each) for the MagmaDNN paper's MLP (784 -> 3 x 528 sigmoid -> 10): throughput, efficiency
X(N) / (N X(1)) with X = samples/s, and the fraction of step time spent in the gradient Allreduce.

    python benchmarks/scaling.py [--ranks 2] [--steps 40] [--strategy allreduce]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HIDDEN, LAYERS, INPUTS, CLASSES = 528, 3, 784, 10


def worker(batch_per_rank: int, steps: int, strategy: str) -> None:
    from magmadnn_cli.distributed import get_communicator
    from magmadnn_cli.layers import Dense
    from magmadnn_cli.losses import CrossEntropy
    from magmadnn_cli.network import Network
    from magmadnn_cli.optimizers import SGD

    comm = get_communicator(strategy)
    net = Network([Dense(HIDDEN, "sigmoid") for _ in range(LAYERS)] + [Dense(CLASSES, "softmax")],
                  (INPUTS,), CrossEntropy(), seed=0)
    opt = SGD(learning_rate=0.05, weight_decay=0.001)
    rng = np.random.default_rng(comm.rank)
    x = rng.random((batch_per_rank, INPUTS), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch_per_rank)
    compute = communicate = 0.0
    for i in range(steps + 5):
        comm.barrier()
        t0 = time.perf_counter()
        net.forward_backward(x, y)
        t1 = time.perf_counter()
        comm.allreduce_sum(net.step_buffer)
        t2 = time.perf_counter()
        opt.step(net.flat_params, net.flat_grads)
        t3 = time.perf_counter()
        if i >= 5:  # warm-up excluded
            compute += (t1 - t0) + (t3 - t2)
            communicate += t2 - t1
    if comm.rank == 0:
        step = (compute + communicate) / steps
        print(json.dumps({"step_s": step, "comm_fraction": communicate / (compute + communicate),
                          "samples_per_s": batch_per_rank * comm.size / step}))


def run(ranks: int, batch_per_rank: int, steps: int, strategy: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--worker", str(batch_per_rank), "--steps", str(steps), "--strategy", strategy]
    if ranks > 1:
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks), *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--strategy", default="allreduce", choices=["allreduce", "ring", "parameter_server"])
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.strategy)
        return
    n = args.ranks
    print(f"paper MLP 784 -> {LAYERS} x {HIDDEN} sigmoid -> 10, 1 BLAS thread per rank, strategy {args.strategy}")
    print(f"{'scaling':<8} {'ranks':>5} {'global batch':>12} {'samples/s':>10} {'efficiency':>10} {'comm %':>7}")
    for kind, per_rank in (("weak", lambda r: 100), ("strong", lambda r: 200 // r)):
        base = run(1, per_rank(1), args.steps, args.strategy)
        for ranks, result in ((1, base), (n, run(n, per_rank(n), args.steps, args.strategy))):
            eff = result["samples_per_s"] / (ranks * base["samples_per_s"])
            print(f"{kind:<8} {ranks:>5} {per_rank(ranks) * ranks:>12} {result['samples_per_s']:>10.0f} "
                  f"{eff:>10.2f} {100 * result['comm_fraction']:>6.1f}%")


if __name__ == "__main__":
    main()
