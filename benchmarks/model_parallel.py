"""Memory and step time of every layout of `distributed.model_parallel` on N ranks: D data-parallel
groups x K model-parallel ranks for each K dividing N (K = 1 pure data parallel, K = N pure model
parallel), beside the same network on 1 process. MLP 784 -> 4096 -> 4096 -> 10 (relu, softmax), Adam,
float32, a global batch of 256 synthetic rows, 1 BLAS thread per rank.

Each layout runs as its own `mpiexec -n N` job (so each peak RSS is that layout's own); the script
launches them, so run it as one process:

    python benchmarks/model_parallel.py [--ranks 4] [--widths 784 4096 4096 10] [--batch 256] [--steps 20]

One layout alone, in a job of your own (prints its row):

    mpiexec -n 4 python benchmarks/model_parallel.py --split 2

Per rank (max over ranks): parameters held; state = weights + gradients + Adam's 2 slots; RSS after
imports and MPI start (base), its peak (ru_maxrss) and resident at the end (now). Communication per
step and rank, from the shapes (payload of each collective, float32): in the group, every split
layer's output allgathered (n x units) and every split layer's input gradient allreduced
(n x fan_in; not the first layer's, whose input is data); across groups, this rank's gradients
allreduced (if D > 1). Step = forward + backward + gradient reduction + update, timed from a barrier
(max over ranks), median and best of --steps after --warmup; the parts are medians (mean over ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does
import numpy as np

from magmadnn_cli.distributed import get_communicator
from magmadnn_cli.distributed.comm import Communicator, launched_rank, launched_ranks
from magmadnn_cli.distributed.data_parallel import DataParallel
from magmadnn_cli.distributed.strategies import STRATEGIES
from magmadnn_cli.distributed.model_parallel import ModelGroups, model_groups
from magmadnn_cli.nn.layers import Dense
from magmadnn_cli.nn.losses import CrossEntropy
from magmadnn_cli.nn.network import Network
from magmadnn_cli.nn.optimizers import Adam

MiB = 2 ** 20


def rss_now() -> float:
    """Resident bytes now (Linux /proc; NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return float("nan")


def rss_peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # KiB on Linux


def comm_volume(widths: list[int], batch: int, size: int, split: int, local: int) -> tuple[int, int]:
    """Bytes per step and rank (collective payloads): within the model group, across groups."""
    rows, group = batch // (size // split), 0
    for i, (fan_in, units) in enumerate(zip(widths, widths[1:])):
        if split > 1 and units >= split:  # Dense.split_over keeps smaller layers whole
            group += rows * units + (rows * fan_in if i else 0)
    across = local + 3 if size // split > 1 else 0  # gradients + the step's 3 statistics
    return 4 * group, 4 * across


class Timed:
    """A model-group communicator that adds up the seconds its split layers spend in collectives."""

    def __init__(self, comm: Communicator) -> None:
        self.comm, self.rank, self.size, self.seconds = comm, comm.rank, comm.size, 0.0

    def allreduce_sum(self, array: Any) -> None:
        t = time.perf_counter()
        self.comm.allreduce_sum(array)
        self.seconds += time.perf_counter() - t

    def allgather_array(self, local: Any, counts: list[int]) -> Any:
        t = time.perf_counter()
        out = self.comm.allgather_array(local, counts)
        self.seconds += time.perf_counter() - t
        return out

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)


def build(world: Communicator, widths: list[int], split: int) -> tuple[ModelGroups, Network, DataParallel, Timed]:
    """The layout's groups, the network split over its model group, the wrapper, the collectives' timer."""
    groups = model_groups(world, split)
    timed = Timed(groups.model)
    layers = [Dense.of(units=w, activation="relu") for w in widths[1:-1]] + [Dense.of(units=widths[-1], activation="softmax")]
    net = Network(layers, (widths[0],), CrossEntropy(), seed=0, group=timed)
    dist = SimpleNamespace(sync_batchnorm=True, max_staleness=0)
    return groups, net, STRATEGIES["allreduce"].wrapper(net, Adam.of(learning_rate=1e-3), groups.data, groups, dist), timed


def worker(args: argparse.Namespace) -> None:
    world = get_communicator(args.strategy)
    base = rss_now()
    groups, net, parallel, timed = build(world, args.widths, args.split)
    rows = args.batch // groups.data.size  # each model group's share of the batch
    group = world.rank // groups.model_ranks
    rng = np.random.default_rng(group)  # the ranks of a model group run the same rows
    x = rng.random((rows, args.widths[0]), dtype=np.float32)
    y = rng.integers(0, args.widths[-1], rows)
    positions = np.arange(rows) + group * rows
    parts = []  # per step: total, forward + backward, in-group collectives, reduction, update
    for i in range(args.warmup + args.steps):
        world.barrier()
        timed.seconds = 0.0
        t0 = time.perf_counter()
        loss = net.forward_backward(x, y, rows / args.batch, positions, key=i)
        t1 = time.perf_counter()
        parallel.reduce(float(loss) * rows, 0, False)
        t2 = time.perf_counter()
        parallel.update()
        t3 = time.perf_counter()
        if i >= args.warmup:
            parts.append((t3 - t0, t1 - t0, timed.seconds, t2 - t1, t3 - t2))
    now = rss_now()
    mine = {"parts": parts, "local": net.local_parameters, "base": base, "now": now, "peak": max(now, rss_peak())}
    report(groups, net, mine, args)


def report(groups: ModelGroups, net: Network, mine: dict, args: argparse.Namespace) -> None:
    """Rank 0 prints this layout's row (as JSON for the driver) after gathering every rank's numbers."""
    world, split = groups.world, groups.model_ranks
    ranks = world.allgather(mine)
    if world.rank:
        return
    steps = np.array([r["parts"] for r in ranks])  # (ranks, steps, parts)
    total = steps[:, :, 0].max(axis=0)
    local = max(r["local"] for r in ranks)
    group_bytes, data_bytes = comm_volume(args.widths, args.batch, world.size, split, local)
    row = {"D": world.size // split, "K": split, "local": local, "total": net.num_parameters,
           "state": 4 * 4 * local, **{k: max(r[k] for r in ranks) for k in ("base", "peak", "now")},
           "group_bytes": group_bytes, "data_bytes": data_bytes, "median": float(np.median(total)),
           "best": float(total.min()), "parts": np.median(steps.mean(axis=0), axis=0)[1:].tolist()}
    print(json.dumps(row) if args.json else f"{HEADER}\n{line(f'{world.size // split} x {split}', row)}", flush=True)


def launch(ranks: int, split: int, args: argparse.Namespace) -> dict:
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    cmd = [sys.executable, __file__, "--split", str(split), "--batch", str(args.batch), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--strategy", args.strategy, "--widths", *map(str, args.widths), "--json"]
    if ranks > 1:
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks), *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode:
        sys.exit(f"layout {ranks // split} x {split} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


HEADER = (f"{'layout':<10} {'params/rank':>11} {'state MiB':>9} {'of model':>8} {'RSS base':>8} {'peak':>6} "
          f"{'now':>6} {'group MiB':>9} {'data MiB':>8} {'step ms':>8} {'best':>7} {'fwd+bwd':>8} "
          f"{'in-group':>8} {'reduce':>7} {'update':>7}")


def line(name: str, r: dict) -> str:
    fb, group, reduce, update = (1000 * s for s in r["parts"])
    return (f"{name:<10} {r['local']:>11,} {r['state'] / MiB:>9.1f} {r['local'] / r['total']:>8.2f} "
            f"{r['base'] / MiB:>8.0f} {r['peak'] / MiB:>6.0f} {r['now'] / MiB:>6.0f} {r['group_bytes'] / MiB:>9.2f} "
            f"{r['data_bytes'] / MiB:>8.2f} {1000 * r['median']:>8.1f} {1000 * r['best']:>7.1f} {fb:>8.1f} "
            f"{group:>8.1f} {reduce:>7.1f} {update:>7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, help="ranks of every layout (N)")
    parser.add_argument("--widths", type=int, nargs="+", default=[784, 4096, 4096, 10],
                        help="inputs, hidden..., classes")
    parser.add_argument("--batch", type=int, default=256, help="global batch (rows per step over all ranks)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps, after --warmup")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank")
    parser.add_argument("--strategy", default="allreduce", choices=["allreduce", "ring", "auto"],
                        help="auto shares one copy of the weights per node at K = 1, which hides its memory")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per layout before giving up")
    parser.add_argument("--split", type=int, help="run this one layout (K) on the ranks mpiexec started")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.split:
        worker(args)
        return
    if launched_ranks() > 1:  # every layout needs a fresh job for an honest peak RSS
        sys.exit(0 if launched_rank() else f"run this as one process (python benchmarks/model_parallel.py --ranks "
                 f"{launched_ranks()}): it starts one mpiexec job per layout; or give --split K for one layout")
    if args.batch % args.ranks:
        parser.error(f"--batch {args.batch} must be divisible by --ranks {args.ranks} (every layout splits it evenly)")
    single = launch(1, 1, args)
    print(f"MLP {' -> '.join(map(str, args.widths))}, Adam, float32, global batch {args.batch}, {args.ranks} "
          f"rank(s) on {os.cpu_count()} cores, {args.threads} BLAS thread(s) per rank, {single['total']:,} parameters; "
          f"layout = D data-parallel groups x K model-parallel ranks; MiB and ms per rank and step")
    print(HEADER)
    print(line("1 process", single))
    for split in [k for k in range(1, args.ranks + 1) if args.ranks % k == 0] if args.ranks > 1 else []:
        print(line(f"{args.ranks // split} x {split}", launch(args.ranks, split, args)), flush=True)


if __name__ == "__main__":
    main()
