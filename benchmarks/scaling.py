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


def overlapped_step(net, comm, x, y) -> float:
    """Backward with one non-blocking Allreduce per layer, started as soon as that layer's gradients
    are final (and MPI progressed at every op); returns the seconds spent waiting afterwards."""
    from mpi4py import MPI
    from magmadnn_cli.core.graph import nn

    offsets, start = {}, 0
    for p in net.parameters:
        offsets[id(p)] = (start, start + p.size)
        start += p.size
    requests = []

    def after_op(op):
        if isinstance(op, nn.Dense):
            params = [i for i in op.inputs if id(i) in offsets]
            lo = min(offsets[id(p)][0] for p in params)
            hi = max(offsets[id(p)][1] for p in params)
            if hi == net.flat_params.size:
                hi = net.step_buffer.size  # the last layer's bucket carries the loss/accuracy slots
            requests.append(comm.comm.Iallreduce(MPI.IN_PLACE, net.step_buffer[lo:hi], op=MPI.SUM))
        if requests:
            MPI.Request.Testall(requests)

    net.mode.training = True
    net.train_graph.forward({net.x: x, net.y: y})
    net.step_stats[:] = 0
    net.train_graph.backward(after_op=after_op)
    t = time.perf_counter()
    MPI.Request.Waitall(requests)
    return time.perf_counter() - t


def worker(batch_per_rank: int, steps: int, strategy: str) -> None:
    from magmadnn_cli.distributed import get_communicator
    from magmadnn_cli.nn.layers import Dense
    from magmadnn_cli.nn.losses import CrossEntropy
    from magmadnn_cli.nn.network import Network
    from magmadnn_cli.nn.optimizers import SGD

    comm = get_communicator("allreduce" if strategy == "overlap" else strategy)
    net = Network([Dense(HIDDEN, "sigmoid") for _ in range(LAYERS)] + [Dense(CLASSES, "softmax")],
                  (INPUTS,), CrossEntropy(), seed=0)
    opt = SGD(learning_rate=0.05, weight_decay=0.001)
    comm.share(net, opt)
    rng = np.random.default_rng(comm.rank)
    x = rng.random((batch_per_rank, INPUTS), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch_per_rank)
    compute = communicate = 0.0
    overlap = strategy == "overlap"
    for i in range(steps + 5):
        comm.barrier()
        t0 = time.perf_counter()
        if overlap and comm.size > 1:
            waited = overlapped_step(net, comm, x, y)
            t2 = time.perf_counter()
            t1 = t2 - waited
        else:
            net.forward_backward(x, y)
            t1 = time.perf_counter()
            comm.allreduce_sum(net.step_buffer)
            t2 = time.perf_counter()
        opt.step(net.flat_params, net.flat_grads, comm.update_share(net.flat_params.size), comm.sum_shares)
        t3 = time.perf_counter()
        comm.update_done()  # shared_memory: waiting for the other shares of the update is communication
        t4 = time.perf_counter()
        if i >= 5:  # warm-up excluded
            compute += (t1 - t0) + (t3 - t2)
            communicate += (t2 - t1) + (t4 - t3)
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
    parser.add_argument("--strategy", default="auto", choices=["auto", "allreduce", "ring", "parameter_server", "shared_memory", "overlap"],
                        help="overlap: per-layer non-blocking Allreduce started during backward (an experiment)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each size, 1 rank and N ranks taking turns; the best of each counts")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.strategy)
        return
    n = args.ranks
    print(f"paper MLP 784 -> {LAYERS} x {HIDDEN} sigmoid -> 10, 1 BLAS thread per rank, strategy {args.strategy}, "
          f"best of {args.repeats} alternating runs")
    print(f"{'scaling':<8} {'ranks':>5} {'global batch':>12} {'samples/s':>10} {'efficiency':>10} {'comm %':>7}")
    for kind, per_rank in (("weak", lambda r: 100), ("strong", lambda r: 200 // r)):
        best: dict[int, dict] = {}
        for _ in range(args.repeats):  # taking turns, so a slow spell of the machine hits both sizes
            for ranks in (1, n):
                result = run(ranks, per_rank(ranks), args.steps, args.strategy)
                if ranks not in best or result["samples_per_s"] > best[ranks]["samples_per_s"]:
                    best[ranks] = result
        for ranks in (1, n):
            result = best[ranks]
            eff = result["samples_per_s"] / (ranks * best[1]["samples_per_s"])
            print(f"{kind:<8} {ranks:>5} {per_rank(ranks) * ranks:>12} {result['samples_per_s']:>10.0f} "
                  f"{eff:>10.2f} {100 * result['comm_fraction']:>6.1f}%")


if __name__ == "__main__":
    main()
