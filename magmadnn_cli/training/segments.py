"""A run's segments: each invocation that trained it (the first, then each --resume), with the epoch it
began at, its ranks and strategy, and its wall time. Checkpoints carry them, so metrics.json of a run
resumed on another rank count says how every epoch was trained, and its wall time is the whole run's."""

from __future__ import annotations

import time
from typing import Any


class Segments:
    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []  # the earlier invocations' segments, as checkpoints keep them
        self.current: dict[str, Any] | None = None
        self._started = time.monotonic()

    def begin(self, epoch: int, processes: int, strategy: str | None) -> None:
        """This invocation trains from `epoch` on (the clock runs from when the segment was made)."""
        self.current = {"from_epoch": epoch, "processes": processes, "strategy": strategy}

    def state(self) -> list[dict[str, Any]]:
        """Every segment so far, this one's wall time up to now (for a checkpoint)."""
        return self.done + ([dict(self.current, wall_time_s=self._elapsed())] if self.current is not None else [])

    def load(self, segments: list[dict[str, Any]] | None) -> None:
        """A checkpoint's segments (None: written before segments were kept, or by an earlier invocation
        that had none)."""
        self.done = [dict(s) for s in segments or [] if isinstance(s, dict)]

    def record(self, seconds: float, epochs_run: int) -> dict[str, Any]:
        """metrics.json's `wall_time_s` (every segment's, this invocation's `seconds` last) and, for a
        resumed run, `segments`: the epochs each trained, on how many ranks, with which strategy."""
        total = round(sum(float(s.get("wall_time_s", 0.0)) for s in self.done) + seconds, 3)
        if not self.done or self.current is None:
            return {"wall_time_s": total}
        every = self.done + [dict(self.current, wall_time_s=round(seconds, 3))]
        ends = [max(s["from_epoch"], after["from_epoch"] - 1) for s, after in zip(every, every[1:])]
        ends.append(max(epochs_run, every[-1]["from_epoch"]))  # an epoch two segments shared is named in both
        return {"wall_time_s": total, "segments": [
            {"epochs": f"{s['from_epoch']}-{end}", "processes": s["processes"], "strategy": s["strategy"],
             "wall_time_s": s["wall_time_s"]} for s, end in zip(every, ends)]}

    def _elapsed(self) -> float:
        return round(time.monotonic() - self._started, 3)
