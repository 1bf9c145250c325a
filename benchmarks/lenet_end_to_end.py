"""`configs/mnist_lenet5.yaml` end to end: training seconds (the epochs' times in metrics.csv) of
`magmadnn train` on 1 process and on `--processes N` (data parallel, one rank per core), beside
PyTorch CPU training the same LeNet-5 on the same rows (same split, batch, epochs, Adam, validation
every epoch, all cores), in alternating rounds so that a slow spell of the machine hits all alike.

    python benchmarks/lenet_end_to_end.py [--rounds 2] [--processes 2]
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "mnist_lenet5.yaml"


def ours(processes: int | str) -> tuple[float, float]:
    """(training seconds, test accuracy) of one `magmadnn train` run."""
    with tempfile.TemporaryDirectory() as out:
        extra = ["--processes", str(processes)] if processes != 1 else []
        subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(CONFIG), "--out", out, "-q", *extra],
                       check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        with open(Path(out) / "metrics.csv") as f:
            seconds = sum(float(row["time"]) for row in csv.DictReader(f))
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    return seconds, float(metrics["test"]["accuracy"])


def torch_run(data, epochs: int, batch: int, lr: float) -> tuple[float, float]:
    """(training seconds, test accuracy) of the same LeNet-5 trained by PyTorch."""
    import torch
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                          nn.ReLU(), nn.Linear(84, 10))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = torch.from_numpy(data.train.x), torch.from_numpy(data.train.y.reshape(-1).astype(np.int64))
    vx, vy = torch.from_numpy(data.validation.x), torch.from_numpy(data.validation.y.reshape(-1).astype(np.int64))
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        for rows in torch.randperm(len(x)).split(batch):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            nn.functional.cross_entropy(model(vx), vy)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        tx, ty = torch.from_numpy(data.test.x), data.test.y.reshape(-1)
        accuracy = float((model(tx).argmax(1).numpy() == ty).mean())
    return seconds, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", default="auto", help="N, or auto: one rank per core")
    args = parser.parse_args()
    from magmadnn_cli.config.loading import load_config
    from magmadnn_cli.data.prepare import prepare
    config = load_config(CONFIG)
    data = prepare(config.data, "classification", config.seed)
    try:
        import torch  # noqa: F401
        runs = {"ours, 1 process": lambda: ours(1), f"ours, {args.processes} processes": lambda: ours(args.processes),
                "PyTorch CPU": lambda: torch_run(data, config.training.epochs, config.training.batch_size,
                                                 config.optimizer.learning_rate)}
    except ImportError:
        runs = {"ours, 1 process": lambda: ours(1), f"ours, {args.processes} processes": lambda: ours(args.processes)}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            results[name].append(run())
    reference = min(s for s, _ in results.get("PyTorch CPU", [(float("nan"), 0.0)]))
    print(f"{'run':<22} {'train s (best)':>14} {'all rounds':>22} {'x PyTorch':>9} {'test acc':>8}")
    for name, rows in results.items():
        best = min(s for s, _ in rows)
        print(f"{name:<22} {best:>14.2f} {' '.join(f'{s:.2f}' for s, _ in rows):>22} {best / reference:>9.2f} "
              f"{rows[-1][1]:>8.3f}")


if __name__ == "__main__":
    main()
