"""Early stopping (Keras' EarlyStopping): stop after `patience` epochs in a row without an
improvement (as Keras and Lightning count: patience 3 runs 4 epochs on a flat loss); with
`restore_best`, the network's whole state of the best epoch (weights and buffers, e.g. batchnorm
running statistics) is kept and put back at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BEST_STATE = "best_state/"


@dataclass
class EarlyStopper:
    monitor: str
    patience: int
    min_delta: float
    restore_best: bool
    best: float = math.nan
    best_epoch: int = 0
    wait: int = 0
    best_state: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def maximize(self) -> bool:
        return "accuracy" in self.monitor

    def update(self, epoch: int, metrics: dict[str, Any], network: Any) -> bool:
        """Record this epoch; True when training should stop."""
        value = metrics.get(self.monitor)
        if value is None:
            return False
        # Keras' arithmetic, so ties at min_delta fall the same way: value -/+ min_delta against the best
        better = (value - self.min_delta > self.best) if self.maximize else (value + self.min_delta < self.best)
        if (math.isnan(self.best) and not math.isnan(value)) or better:  # a NaN is no improvement, as in Keras
            self.best, self.best_epoch, self.wait = value, epoch, 0
            if self.restore_best:
                self.best_state = network.state_dict()
            return False
        self.wait += 1
        return self.wait >= self.patience

    def announcement(self, epoch: int) -> str:
        """What a user reads when it fires."""
        kept = (f"restoring epoch {self.best_epoch}'s weights ({self.monitor} {self.best:.4f})" if self.restore_best
                else f"keeping epoch {epoch}'s weights (restore_best is off; the best was epoch {self.best_epoch})")
        return (f"early stopping after epoch {epoch}: {self.monitor} has not improved by more than {self.min_delta:g} "
                f"for {self.patience} epoch(s); {kept}")

    def restore(self, network: Any) -> None:
        """Put the best epoch's state back into the network (when it was kept)."""
        if self.best_state is not None:
            network.load_state_dict(self.best_state)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}
        state.update({BEST_STATE + k: v for k, v in (self.best_state or {}).items()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.wait = float(state["best"]), int(state["best_epoch"]), int(state["wait"])
        best = {k.removeprefix(BEST_STATE): v for k, v in state.items() if k.startswith(BEST_STATE)}
        self.best_state = best or None
