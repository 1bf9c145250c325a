"""When asynchronous SGD pays: synchronous data parallelism vs `distributed.strategy: async` with one
rank artificially slowed (`benchmarks/straggler.py`: K times slower, sleeping so that it leaves its
core to the others, as a rank on a machine of its own would).

Both use the same W workers: synchronous SGD runs W ranks (each step waits for the slowest rank's
share of the batch); asynchronous SGD runs W + 1 (rank 0 serves: it holds the weights and applies
each gradient; it mostly waits, polling, so it adds no busy core). Every run trains the same
config for the same epochs (the same optimizer steps, each on one batch); the table gives the wall
time per epoch, the throughput ratio to synchronous SGD at that slowdown, the final test accuracy,
the validation accuracy reached per wall second, and the server's staleness record. Run as one
process (it launches each job):

    python benchmarks/async_sgd.py [--config configs/mnist_mlp.yaml] [--workers 2] [--epochs 8]
                                   [--slowdowns 1 2 4] [--bounds 0 2 8]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STRAGGLER = ROOT / "benchmarks" / "straggler.py"


def run(config: Path, out: Path, ranks: int, slow_rank: int, slowdown: float, epochs: int,
        overrides: list[str]) -> dict[str, Any]:
    """One training job; its metrics, per-epoch history and wall time (launch included)."""
    from magmadnn_cli.distributed.launcher import locate_mpi_launcher
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if slowdown > 1:
        env["MAGMADNN_SLOW_RANK"] = f"{slow_rank}:x{slowdown}"
    sets = [a for o in [f"training.epochs={epochs}", "training.early_stopping=null", "training.checkpoint=false",
                        *overrides] for a in ("--set", o)]
    start = time.perf_counter()
    subprocess.run([locate_mpi_launcher(), "-n", str(ranks), sys.executable, str(STRAGGLER), "train", str(config),
                    "--out", str(out), "-q", *sets], check=True, env=env, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    with open(out / "metrics.csv") as f:
        history = list(csv.DictReader(f))
    return {"metrics": json.loads((out / "metrics.json").read_text()), "history": history, "wall": wall}


def row(name: str, result: dict[str, Any], sync_epoch: float, target: float) -> list[str]:
    history, metrics = result["history"], result["metrics"]
    epoch = sum(float(h["time"]) for h in history) / len(history)
    elapsed, reached = 0.0, "-"
    for h in history:  # the first epoch whose validation accuracy reaches the target
        elapsed += float(h["time"])
        if float(h["val_accuracy"]) >= target:
            reached = f"{elapsed:.2f}"
            break
    record = metrics.get("async_sgd")
    stale = f"{record['staleness_mean']:.1f} / {record['staleness_max']}" if record else "-"
    share = "/".join(map(str, record["steps_per_worker"])) if record else "-"
    return [name, f"{epoch:.3f}", f"{sync_epoch / epoch:.2f}", f"{metrics['test']['accuracy']:.4f}", reached,
            stale, share]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "mnist_mlp.yaml")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[1, 2, 4])
    parser.add_argument("--bounds", type=int, nargs="+", default=[0, 2, 8])
    parser.add_argument("--target", type=float, default=0.85, help="validation accuracy to time (default 0.85)")
    args = parser.parse_args()
    w = args.workers
    header = ["run", "s/epoch", "x sync", "test acc", f"s to val {args.target}", "stale mean/max", "steps/worker"]
    print(f"{args.config.name}, {args.epochs} epochs, {w} workers (the last one slowed), 1 BLAS thread per rank")
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.slowdowns:
            print(f"\nslowdown x{k:g} of one worker")
            print(" | ".join(header))
            sync = run(args.config, Path(tmp) / f"sync{k}", w, w - 1, k, args.epochs, [])
            sync_epoch = sum(float(h["time"]) for h in sync["history"]) / len(sync["history"])
            print(" | ".join(row(f"sync ({w} ranks)", sync, sync_epoch, args.target)), flush=True)
            for bound in args.bounds:
                result = run(args.config, Path(tmp) / f"async{k}-{bound}", w + 1, w, k, args.epochs,
                             ["distributed.strategy=async", f"distributed.max_staleness={bound}"])
                print(" | ".join(row(f"async bound {bound} ({w + 1} ranks)", result, sync_epoch, args.target)),
                      flush=True)


if __name__ == "__main__":
    main()
