"""What a GPU training step sends across the host boundary and allocates, counted on any CPU by the
suite's device stand-in (tests/standin/cupy): structure, never speed. Prints, for `digits_mlp` trained
one epoch with `device: gpu`, the reads and copies inside steps and the statistics reads per epoch;
and for the paper's MLP (784 -> 4 x 528 -> 10) each optimizer's new device bytes and operations per
update, fused (one kernel) against the rule run as separate array operations."""

from __future__ import annotations

import sys
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "standin"))

import cupy
import numpy as np

from magmadnn_cli import cli
from magmadnn_cli.core import backend as B
from magmadnn_cli.nn.optimizers import OPTIMIZERS
from magmadnn_cli.training.trainer import Trainer

PAPER_MLP = 784 * 528 + 3 * 528 * 528 + 528 * 10 + 4 * 528 + 10


def step_crossings() -> None:
    tallies = []
    train_step = Trainer.train_step

    def watched(self, *args):
        with cupy.LEDGER.watch() as tally:
            result = train_step(self, *args)
        tallies.append(tally)
        return result
    Trainer.train_step = watched
    with TemporaryDirectory() as out, cupy.LEDGER.watch() as whole:
        sys.argv = ["magmadnn", "train", str(ROOT / "configs" / "digits_mlp.yaml"), "--set", "device=gpu",
                    "--set", "training.epochs=1", "--out", f"{out}/run", "-q"]
        try:
            cli.main()
        except SystemExit:
            pass
    Trainer.train_step = train_step
    inside = sum(sum(t.reads.values()) + sum(t.copies.values()) for t in tallies[1:])
    print(f"digits_mlp, 1 epoch, {len(tallies)} steps: reads+copies inside steps after the first: {inside}; "
          f"whole run: {sum(whole.reads.values())} reads, {sum(whole.copies.values())} copies")


def update_costs() -> None:
    with B.using(B.select("gpu")):
        for name in ("sgd", "adam", "adamw", "rmsprop", "adagrad", "adamax"):
            opt = OPTIMIZERS[name].of(learning_rate=0.001)
            p, g = cupy.zeros(PAPER_MLP, dtype=np.float32), cupy.ones(PAPER_MLP, dtype=np.float32)
            opt.step(p, g)
            with cupy.LEDGER.watch() as fused:
                opt.step(p, g, cupy.isfinite(g[0]))
            with cupy.LEDGER.watch() as separate:
                opt.apply(p, g, opt.state)
            print(f"{name:8s} paper MLP ({p.nbytes / 1e6:.1f} MB of parameters): fused {fused.new_bytes / 1e6:.1f} MB "
                  f"new, {fused.operations} ops; separate ops {separate.new_bytes / 1e6:.1f} MB, {separate.operations} ops")


if __name__ == "__main__":
    step_crossings()
    update_costs()
