"""The training steps' statistics, kept where the step computed them and read back in one transfer.

Each step's reduced statistics (global loss sum, correct count, stop request) stay in device memory;
the host reads them every `every` steps and at the epoch's end, checkpoints and stops: on a GPU every
`READ_EVERY` steps, so no step waits for the host; on the CPU, where a read costs nothing, after every
step. A non-finite loss is seen at the next read (its update was already skipped on the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core import backend as B

Array = Any
READ_EVERY = 50  # steps between reads of the statistics from a GPU


@dataclass(frozen=True)
class StepRecord:
    """One step as read back: where it was, its global rows, and its reduced statistics."""
    step: int
    count: int
    global_step: int
    loss_sum: float
    correct: float
    stop: bool


class StepLog:
    """Device rows of step statistics since the last read."""

    def __init__(self, every: int | None = None) -> None:
        self.every = every or (1 if B.current().device == "cpu" else READ_EVERY)
        self._rows: Array | None = None
        self._pending: list[tuple[int, int, int]] = []  # (step, rows, global step), host facts

    def add(self, stats: Array, step: int, count: int, global_step: int) -> None:
        """Keep a step's reduced statistics (a device copy: no transfer)."""
        if self._rows is None or self._rows.shape[1] != stats.size or self._rows.dtype != stats.dtype:
            self._rows = B.array_module(stats).empty((self.every, stats.size), dtype=stats.dtype)
        self._rows[len(self._pending)] = stats
        self._pending.append((step, count, global_step))

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.every

    def __len__(self) -> int:
        return len(self._pending)

    def read(self) -> list[StepRecord]:
        """Every step kept since the last read, in order (one transfer), and forget them."""
        if not self._pending:
            return []
        assert self._rows is not None
        values = np.asarray(B.to_host(self._rows[:len(self._pending)]), dtype=np.float64)
        records = [StepRecord(step, count, global_step, float(row[0]), float(row[1]), bool(row[2] > 0))
                   for (step, count, global_step), row in zip(self._pending, values)]
        self._pending = []
        return records
