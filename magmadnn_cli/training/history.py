"""A training's history: each epoch's metrics and how it ended, as metrics.csv and checkpoints keep it."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class History:
    epochs: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False
    pruned: bool = False
    best_epoch: int | None = None

    def csv(self) -> str:
        """metrics.csv: one row per epoch, a column per metric any epoch has."""
        columns = list(dict.fromkeys(k for row in self.epochs for k in row))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns or ["epoch"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.epochs)
        return text.getvalue()


def epochs_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The history's epochs in a trainer's state: JSON lines (checkpoint format 3), or a list (format 2)."""
    lines = state.get("history_epochs")
    if lines is None:
        return list(state["history"].get("epochs", []))
    epochs = [json.loads(line) for line in lines.tobytes().split(b"\n") if line]
    if not all(isinstance(e, dict) for e in epochs):
        raise ValueError("the history's epochs are not JSON objects")
    return epochs
