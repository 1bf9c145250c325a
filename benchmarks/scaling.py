"""Weak and strong scaling of data-parallel training on this machine (1 vs N ranks, 1 BLAS thread
each): throughput, efficiency X(N) / (N X(1)) with X = samples/s, and the fraction of step time
spent in communication. Models: the MagmaDNN paper's MLP (784 -> 3 x 528 sigmoid -> 10), the same
with dropout 0.2 after each hidden layer (counter-based masks), and a small conv net with batchnorm
(synchronized over ranks, or per rank with --local-batchnorm) on 1 x 16 x 16 images.

    python benchmarks/scaling.py [--ranks 2] [--steps 40] [--strategy auto] [--model mlp|dropout|conv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does
import numpy as np

HIDDEN, LAYERS, INPUTS, CLASSES = 528, 3, 784, 10
IMAGE = (1, 16, 16)


def build(model: str):
    from magmadnn_cli.nn.layers import Activation, BatchNorm, Conv2D, Dense, Dropout, GlobalAvgPool, Pool2D
    from magmadnn_cli.nn.losses import CrossEntropy
    from magmadnn_cli.nn.network import Network

    if model == "conv":  # two conv -> batchnorm -> relu stages, as in resnet_small
        layers = [Conv2D.of(filters=16, kernel_size=3, padding="same", use_bias=False), BatchNorm.of(), Activation.of(activation="relu"), Pool2D.of(mode="max", pool_size=2),
                  Conv2D.of(filters=32, kernel_size=3, padding="same", use_bias=False), BatchNorm.of(), Activation.of(activation="relu"), GlobalAvgPool.of(),
                  Dense.of(units=CLASSES, activation="softmax")]
        return Network(layers, IMAGE, CrossEntropy(), seed=0), IMAGE
    hidden = [[Dense.of(units=HIDDEN, activation="sigmoid")] + ([Dropout.of(rate=0.2)] if model == "dropout" else []) for _ in range(LAYERS)]
    return Network([x for block in hidden for x in block] + [Dense.of(units=CLASSES, activation="softmax")], (INPUTS,),
                   CrossEntropy(), seed=0), (INPUTS,)


def timed_reduce(comm, seconds: list[float]):
    """The batchnorm reduction, timed (it runs inside the forward and backward passes)."""
    def reduce(array) -> None:
        t = time.perf_counter()
        comm.allreduce_sum(array)
        seconds[0] += time.perf_counter() - t
    return reduce


def worker(batch_per_rank: int, steps: int, strategy: str, model: str, sync_batchnorm: bool,
           profile: bool = False, exchange: bool = True) -> None:
    from types import SimpleNamespace

    from magmadnn_cli.distributed import get_communicator, row_exchange
    from magmadnn_cli.distributed.model_parallel import model_groups
    from magmadnn_cli.distributed.strategies import STRATEGIES
    from magmadnn_cli.nn.optimizers import SGD

    if not exchange:  # shared_memory: every rank computes its own dense weight gradients, then sums
        row_exchange.RATIO = 0.0
    comm = get_communicator(strategy)
    net, shape = build(model)
    dist = SimpleNamespace(sync_batchnorm=sync_batchnorm, max_staleness=0)
    parallel = STRATEGIES[strategy].wrapper(net, SGD.of(learning_rate=0.05, weight_decay=0.001), comm,
                                            model_groups(comm, 1), dist)
    in_layers = [0.0]
    if net.mode.reduce is not None:
        net.mode.reduce = timed_reduce(comm, in_layers)
    rng = np.random.default_rng(comm.rank)
    x = rng.random((batch_per_rank, *shape), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch_per_rank)
    positions = np.arange(batch_per_rank) + comm.rank * batch_per_rank
    compute = communicate = synchronizing = 0.0
    parts = dict.fromkeys(("forward_backward", "wait", "reduce", "update"), 0.0)
    for i in range(steps + 5):
        comm.barrier()
        in_layers[0] = 0.0
        t0 = time.perf_counter()
        loss = net.forward_backward(x, y, 1.0 / comm.size, positions, key=i)
        t1 = time.perf_counter()
        if profile:
            comm.barrier()  # the wait for the slower rank, out of the reduction's time
        tw = time.perf_counter()
        parallel.reduce(loss * len(x), 0, False)
        t2 = time.perf_counter()
        parallel.update()  # shared_memory: includes waiting for the other shares (counted as compute)
        t3 = time.perf_counter()
        if i >= 5:  # warm-up excluded
            compute += (t1 - t0 - in_layers[0]) + (t3 - t2)
            communicate += (t2 - t1) + in_layers[0]
            synchronizing += in_layers[0]
            for part, seconds in zip(parts, (t1 - t0, tw - t1, t2 - tw, t3 - t2)):
                parts[part] += seconds / steps
    if comm.rank == 0:
        step = (compute + communicate) / steps
        print(json.dumps({"step_s": step, "comm_fraction": communicate / (compute + communicate),
                          "batchnorm_sync_fraction": synchronizing / (compute + communicate),
                          "samples_per_s": batch_per_rank * comm.size / step, "parts_s": parts}))


ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _worker_command(batch_per_rank: int, args: argparse.Namespace) -> list[str]:
    return [sys.executable, __file__, "--worker", str(batch_per_rank), "--steps", str(args.steps), "--strategy",
            args.strategy, "--model", args.model, *(["--local-batchnorm"] if args.local_batchnorm else []),
            *(["--profile"] if args.profile else []), *(["--no-exchange"] if args.no_exchange else [])]


def _result(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def run(ranks: int, batch_per_rank: int, args: argparse.Namespace) -> dict:
    cmd = _worker_command(batch_per_rank, args)
    if ranks > 1:
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks), *cmd]
    return _result(subprocess.run(cmd, env=ENV, capture_output=True, text=True, check=True).stdout)


def independent(processes: int, batch: int, args: argparse.Namespace) -> dict:
    """`processes` one-process runs at once, no MPI and nothing shared: what N ranks could reach on
    this machine if communication and synchronization were free (the slowest process counts)."""
    jobs = [subprocess.Popen(_worker_command(batch, args), env=ENV, stdout=subprocess.PIPE, text=True)
            for _ in range(processes)]
    results = [_result(job.communicate()[0]) for job in jobs]
    return max(results, key=lambda r: r["step_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--strategy", default="auto", choices=["auto", "allreduce", "ring", "parameter_server", "shared_memory"])
    parser.add_argument("--model", default="mlp", choices=["mlp", "dropout", "conv"])
    parser.add_argument("--local-batchnorm", action="store_true", help="per-rank batchnorm statistics (the opt-out)")
    parser.add_argument("--compare", choices=["batchnorm", "dropout", "exchange"],
                        help="the cost of synchronized batchnorm (conv net, synchronized vs per rank), of "
                             "counter-based dropout (paper MLP with vs without), or the gain of shared_memory's "
                             "dense row exchange (paper MLP with vs without), 1 and N ranks, variants taking turns")
    parser.add_argument("--no-exchange", action="store_true",
                        help="shared_memory: each rank computes its own dense weight gradients, then they are summed")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each size, 1 rank and N ranks taking turns; the best of each counts")
    parser.add_argument("--profile", action="store_true",
                        help="where strong scaling's step time goes: forward/backward, waiting for the slower "
                             "rank, reduction, update, beside the 1-rank step at the same rows per rank")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.strategy, args.model, not args.local_batchnorm, args.profile,
               not args.no_exchange)
        return
    if args.profile:
        profile(args)
        return
    if args.compare:
        compare(args)
        return
    n = args.ranks
    what = {"mlp": f"paper MLP 784 -> {LAYERS} x {HIDDEN} sigmoid -> 10", "dropout": "paper MLP + dropout 0.2",
            "conv": "conv net (2 x conv-batchnorm-relu) on 1x16x16, batchnorm "
                    + ("per rank" if args.local_batchnorm else "synchronized")}[args.model]
    print(f"{what}, 1 BLAS thread per rank, strategy {args.strategy}, best of {args.repeats} alternating runs")
    print(f"{'scaling':<8} {'ranks':>5} {'global batch':>12} {'samples/s':>10} {'step ms':>8} {'efficiency':>10} {'comm %':>7}")
    for kind, per_rank in (("weak", lambda r: 100), ("strong", lambda r: 200 // r)):
        best: dict[int, dict] = {}
        for _ in range(args.repeats):  # taking turns, so a slow spell of the machine hits both sizes
            for ranks in (1, n):
                result = run(ranks, per_rank(ranks), args)
                if ranks not in best or result["samples_per_s"] > best[ranks]["samples_per_s"]:
                    best[ranks] = result
        for ranks in (1, n):
            result = best[ranks]
            eff = result["samples_per_s"] / (ranks * best[1]["samples_per_s"])
            print(f"{kind:<8} {ranks:>5} {per_rank(ranks) * ranks:>12} {result['samples_per_s']:>10.0f} "
                  f"{1000 * result['step_s']:>8.2f} {eff:>10.2f} {100 * result['comm_fraction']:>6.1f}%")


def profile(args: argparse.Namespace) -> None:
    """Strong scaling's loss, part by part: 1 rank on the global batch of 200, 1 rank on N ranks'
    rows each (what a rank computes), N such processes at once with nothing shared (the ceiling: free
    communication), and N ranks (a barrier after the backward pass separates the wait for the slower
    rank from the reduction); best step of repeats, runs taking turns."""
    n, best = args.ranks, {}
    rows = 200 // n
    runs = {"1 rank, 200 rows": lambda: run(1, 200, args), f"1 rank, {rows} rows": lambda: run(1, rows, args),
            f"{n} x 1 rank, {rows} rows, at once": lambda: independent(n, rows, args),
            f"{n} ranks, {rows} rows each": lambda: run(n, rows, args)}
    for _ in range(args.repeats):
        for label, measure in runs.items():
            result = measure()
            if label not in best or result["step_s"] < best[label]["step_s"]:
                best[label] = result
    ideal = best["1 rank, 200 rows"]["step_s"] / n
    print(f"strong scaling over {n} ranks, strategy {args.strategy}: ms a step, and the share of the "
          f"ideal step ({1000 * ideal:.2f} ms = the 1-rank step / {n})")
    print(f"{'run':<34} {'step':>7} {'fwd+bwd':>8} {'wait':>7} {'reduce':>7} {'update':>7}")
    for label, result in best.items():
        p = result["parts_s"]
        print(f"{label:<34} {1000 * result['step_s']:>7.2f} " + " ".join(
            f"{1000 * p[k]:>7.2f}" for k in ("forward_backward", "wait", "reduce", "update")))
    ceiling = ideal / best[f"{n} x 1 rank, {rows} rows, at once"]["step_s"]
    efficiency = ideal / best[f"{n} ranks, {rows} rows each"]["step_s"]
    print(f"efficiency {efficiency:.2f}; without any communication ({n} independent processes) {ceiling:.2f}: "
          f"the ranks reach {efficiency / ceiling:.2f} of that")


def compare(args: argparse.Namespace) -> None:
    """Step time of two variants at 1 and N ranks (batch 100 per rank), taking turns: best of repeats."""
    variants = {"batchnorm": [("synchronized batchnorm", "conv", False, False), ("per-rank batchnorm", "conv", True, False)],
                "dropout": [("no dropout", "mlp", False, False), ("counter-based dropout", "dropout", False, False)],
                "exchange": [("own gradients, summed", "mlp", False, True),
                             ("dense rows exchanged", "mlp", False, False)]}[args.compare]
    best: dict[tuple[str, int], dict] = {}
    for _ in range(args.repeats):
        for ranks in (1, args.ranks):
            for name, model, local, own in variants:
                variant = argparse.Namespace(**{**vars(args), "model": model, "local_batchnorm": local,
                                                "no_exchange": own})
                result = run(ranks, 100, variant)
                if (name, ranks) not in best or result["step_s"] < best[name, ranks]["step_s"]:
                    best[name, ranks] = result
    print(f"{args.compare}: batch 100 per rank, 1 BLAS thread per rank, strategy {args.strategy}, "
          f"best of {args.repeats}, variants taking turns")
    print(f"{'variant':<24} {'ranks':>5} {'step ms':>8} {'comm %':>7} {'bn sync %':>9} {'vs first':>9}")
    for ranks in (1, args.ranks):
        base = best[variants[0][0], ranks]["step_s"]
        for name, *_ in variants:
            r = best[name, ranks]
            print(f"{name:<24} {ranks:>5} {1000 * r['step_s']:>8.2f} {100 * r['comm_fraction']:>6.1f}% "
                  f"{100 * r['batchnorm_sync_fraction']:>8.1f}% {r['step_s'] / base:>9.3f}")


if __name__ == "__main__":
    main()
