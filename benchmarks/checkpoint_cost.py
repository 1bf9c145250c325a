"""What a checkpoint after every epoch (the default) costs on a small tabular run, whose epochs
take milliseconds: the same training with checkpoints every epoch and with none, run in this
process, and the cost per checkpoint over the first and the last tenth of the epochs. A cost that
grows with the epochs run (each checkpoint re-encoding the whole history, as before format 3)
shows as a last tenth much dearer than the first.

    python benchmarks/checkpoint_cost.py [--epochs 1500] [--rows 300]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from magmadnn_cli.commands.train import train
from magmadnn_cli.config.loading import load_config
from magmadnn_cli.training.checkpoint import Saver

CONFIG = """\
name: checkpoint_cost
seed: 1
data: {{train: {csv}, target: y}}
model:
  layers:
    - {{type: dense, units: 64, activation: relu}}
    - {{type: dense, units: 1}}
loss: mse
optimizer: {{type: adam, learning_rate: 0.001}}
training: {{epochs: {epochs}, batch_size: 32}}
"""


def write_data(folder: Path, rows: int) -> Path:
    r = np.random.default_rng(0)
    x = r.normal(size=(rows, 5))
    y = x @ r.normal(size=5) + 0.1 * r.normal(size=rows)
    path = folder / "data.csv"
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", fmt="%.5f", header="a,b,c,d,e,y", comments="")
    return path


def timed_writes(monkeypatch_target: type) -> list[float]:
    """Wrap Saver.write to record each call's seconds."""
    seconds: list[float] = []
    real = monkeypatch_target.write

    def write(self, trainer):
        start = time.perf_counter()
        path = real(self, trainer)
        seconds.append(time.perf_counter() - start)
        return path
    monkeypatch_target.write = write
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1500)
    parser.add_argument("--rows", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config_path = folder / "c.yaml"
        config_path.write_text(CONFIG.format(csv=write_data(folder, args.rows), epochs=args.epochs))
        walls = {}
        for label, overrides in (("none", ["training.checkpoint=null"]), ("every epoch", [])):
            writes = timed_writes(Saver) if overrides == [] else []
            start = time.perf_counter()
            train(load_config(config_path, overrides), folder / label.replace(" ", "_"))
            walls[label] = time.perf_counter() - start
        tenth = max(1, len(writes) // 10)
        first, last = np.mean(writes[:tenth]) * 1e3, np.mean(writes[-tenth:]) * 1e3
    print(f"{args.epochs} epochs of {args.rows} rows")
    print(f"  wall, no checkpoints:          {walls['none']:.2f} s")
    print(f"  wall, a checkpoint each epoch: {walls['every epoch']:.2f} s "
          f"({walls['every epoch'] / walls['none']:.2f}x)")
    print(f"  per checkpoint, first tenth:   {first:.2f} ms")
    print(f"  per checkpoint, last tenth:    {last:.2f} ms ({last / first:.2f}x the first)")


if __name__ == "__main__":
    main()
