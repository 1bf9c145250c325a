"""Streamed epochs against the in-memory path (issue 48, item 2): a generated CSV (numbers, a category
column, missing cells) trained one epoch by `magmadnn train` with data.stream: false and true, each in
its own process: rows per second (training rows / the whole run's wall time, reading and fitting
included) and the process's peak RSS. Scaled down (the default 100 MB, not the issue's 10 GB) for a
shared machine.

    python benchmarks/big_data.py [--mb 100] [--folder /tmp/big_data] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

NUMBERS = 12
CONFIG = """\
name: big-data
seed: 0
data: {{train: {table}, target: label, validation_split: 0.05, stream: {stream}}}
model:
  layers:
    - {{type: dense, units: 32, activation: relu}}
    - {{type: dense, units: 2, activation: softmax}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.001}}
training: {{epochs: {epochs}, batch_size: 256, checkpoint: false}}
"""


def generate(path: Path, mb: int) -> int:
    """A CSV of about `mb` MB, written in chunks; returns its rows."""
    rng, rows = np.random.default_rng(0), 0
    with open(path, "w") as f:
        f.write(",".join([f"n{i}" for i in range(NUMBERS)] + ["kind", "label"]) + "\n")
        while f.tell() < mb * 1_000_000:
            x = rng.standard_normal((100_000, NUMBERS))
            kind = rng.integers(0, 5, len(x))
            label = np.where(x[:, 0] + x[:, 1] + (kind == 2) > 0, "yes", "no")
            text = np.char.mod("%.4f", x).astype(object)
            text[rng.random(x.shape) < 0.02] = ""
            lines = [",".join(r) + f",k{k},{y}" for r, k, y in zip(text.tolist(), kind, label)]
            f.write("\n".join(lines) + "\n")
            rows += len(x)
    return rows


def one(config: Path, out: Path) -> None:
    """Child: train, then print wall time and peak RSS as JSON."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(out), "-q",
                           "--overwrite"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stdout + done.stderr)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_rss": peak}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/big_data"))
    parser.add_argument("--one", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(*args.one)
    args.folder.mkdir(parents=True, exist_ok=True)
    table = args.folder / f"table_{args.mb}mb.csv"
    rows = generate(table, args.mb) if not table.exists() else sum(1 for _ in open(table)) - 1
    print(f"{table}: {table.stat().st_size / 1e6:.0f} MB, {rows:,} rows")
    for stream in ("false", "true"):
        config = args.folder / f"stream_{stream}.yaml"
        config.write_text(CONFIG.format(table=table, stream=stream, epochs=args.epochs))
        done = subprocess.run([sys.executable, __file__, "--one", str(config), str(args.folder / f"run_{stream}")],
                              capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        metrics = json.loads((args.folder / f"run_{stream}" / "metrics.json").read_text())
        print(f"data.stream: {stream:5}  {rows * args.epochs / result['seconds']:9,.0f} rows/s (whole run)  "
              f"peak RSS {result['peak_rss'] / 2**20:6,.0f} MiB  val accuracy "
              f"{metrics['validation']['accuracy']:.3f}")


if __name__ == "__main__":
    main()
