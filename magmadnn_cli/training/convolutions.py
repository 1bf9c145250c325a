"""Which algorithm runs each convolution layer, decided once before a run's first step."""

from __future__ import annotations

from typing import Any

from ..core import backend as B
from .trainer import Trainer


def choose_convolutions(trainer: Trainer, train_x: Any) -> None:
    """Each convolution's algorithm: `auto` by the fixed rule (every rank alike, no timing);
    `fastest` by dMath's autotuning, opt-in: rank 0 times the candidates on a batch of the training
    data (the rows one rank runs per step) and every rank runs its choice. A resumed run keeps its
    checkpoint's choice. (Under model parallelism rank 0's whole group runs the timing passes, which
    gather over it.) The choice is said in the run's log and kept in `trainer.conv_algorithms`."""
    net = trainer.net
    if not net.conv_layers() or trainer.conv_algorithms is not None:
        return
    rows = -(-trainer.sizes.size(trainer.position.epoch) // trainer.shares)
    times: dict[str, dict[str, float]] = {}
    if any(layer.algorithm == "fastest" for layer in net.conv_layers()):
        timing = trainer.data_comm.is_root
        tuned = (net.tune_convolutions(B.to_device(train_x[:rows])), net.conv_algorithms()) if timing else None
        times, trainer.conv_algorithms = trainer.comm.bcast(tuned)
    else:
        trainer.conv_algorithms = net.conv_algorithms()
    asked = {layer.name: layer.algorithm for layer in net.conv_layers()}
    trainer.reporter.info(_report(trainer.conv_algorithms, asked, times, min(rows, len(train_x))))


def _report(chosen: dict[str, str], asked: dict[str, str], times: dict[str, dict[str, float]], rows: int) -> str:
    """One run-log line: each convolution layer's algorithm, with the timings that chose it."""
    parts = []
    for name, algorithm in chosen.items():
        if name in times:
            timed = ", ".join(f"{a} {s * 1e3:.2f} ms" for a, s in sorted(times[name].items(), key=lambda i: i[1]))
            parts.append(f"{name} {algorithm} (timed on {rows} rows: {timed})")
        elif asked.get(name) == "auto":
            parts.append(f"{name} {algorithm} (auto: the fixed rule)")
        elif asked.get(name, algorithm) != algorithm:
            parts.append(f"{name} {algorithm} (the config's {asked[name]} cannot run this layer)")
        else:
            parts.append(f"{name} {algorithm} (set in the config)")
    return "convolutions: " + "; ".join(parts)
