"""The global batch size of every epoch (`training.batch_size`, then `training.batch_schedule`'s
growth: Smith et al. 2018, "Don't decay the learning rate, increase the batch size"), and where a
global step falls in epochs, for learning-rate schedules that are functions of the epoch."""

from __future__ import annotations

import bisect
import collections
import contextlib
import contextvars
import math
import threading
from typing import Any, Iterable, Iterator, TypeVar

import numpy as np

T = TypeVar("T")
PREFETCH = 1  # batches drawn ahead of the step on the CPU (0: each drawn when its step comes)


def steps_per_epoch(rows: int, batch_size: int) -> int:
    return max(1, math.ceil(rows / batch_size))


class BatchSchedule:
    """`batch_size` from epoch 1; from epoch E on, `changes[E]` (the latest E reached). With gradient
    accumulation each update takes `accumulation` batches of that size: an epoch's steps count
    updates (what schedules, checkpoints and resume count); memory is that of one batch."""

    def __init__(self, batch_size: int, changes: dict[int, int] | None = None, accumulation: int = 1) -> None:
        self.first = batch_size
        self.changes = sorted((changes or {}).items())
        self.accumulation = accumulation
        self._ends: list[int] = []  # for the rows last asked about
        self._rows = -1

    def size(self, epoch: int) -> int:
        size = self.first
        for start, batch in self.changes:
            if epoch >= start:
                size = batch
        return size

    def largest(self) -> int:
        return max([self.first, *(batch for _, batch in self.changes)])

    def update_size(self, epoch: int) -> int:
        """Rows per update: the batch size times the batches accumulated into it."""
        return self.size(epoch) * self.accumulation

    def steps(self, rows: int, epoch: int) -> int:
        """Updates in the epoch."""
        return steps_per_epoch(rows, self.update_size(epoch))

    def epochs_done(self, rows: int, step: int) -> float:
        """Epochs completed (with the fraction of the one in progress) after `step` global steps."""
        if rows != self._rows:
            self._ends, self._rows = [], rows
        while not self._ends or self._ends[-1] <= step:  # the global step at which each epoch ends
            self._ends.append((self._ends[-1] if self._ends else 0) + self.steps(rows, len(self._ends) + 1))
        done = bisect.bisect_right(self._ends, step)
        start = self._ends[done - 1] if done else 0
        return done + (step - start) / (self._ends[done] - start)


def split_bounds(lo: int, hi: int, shares: int, share: int) -> tuple[int, int]:
    """Share `share` of [lo, hi) cut into `shares` contiguous parts as `numpy.array_split` cuts them."""
    size, extra = divmod(hi - lo, shares)
    start = lo + share * size + min(share, extra)
    return start, start + size + (share < extra)


def rebatched(pieces: Iterator[tuple[np.ndarray, ...]], size: int) -> Iterator[tuple[np.ndarray, ...]]:
    """Pieces of rows (tuples of arrays cut alike) regrouped into batches of `size` rows, in order;
    the last may be shorter. A batch inside one piece is a view of it; only a batch that spans pieces
    is copied. Holds at most one batch and one piece."""
    held: tuple[np.ndarray, ...] | None = None  # rows left over from the pieces before (fewer than `size`)
    for piece in pieces:
        start, count = 0, len(piece[0])
        if held is not None:
            start = min(size - len(held[0]), count)
            held = tuple(np.concatenate([a, b[:start]]) for a, b in zip(held, piece))
            if len(held[0]) < size:
                continue
            yield held
            held = None
        cut = start + (count - start) // size * size
        for lo in range(start, cut, size):
            yield tuple(a[lo:lo + size] for a in piece)
        held = tuple(a[cut:] for a in piece) if cut < count else None
    if held is not None:
        yield held


class Prefetch:
    """The items of `items` (an epoch's batches, each gathered and augmented as it is drawn), drawn up
    to `ahead` early by one background thread (in the caller's context: its backend) while the caller
    runs the current step; bounded (at most `ahead` drawn and not yet taken), in order. What drawing
    raises is raised where its item would have been taken. `close()` (or leaving the `with`) stops the
    thread and waits for it: no thread outlives the loop, whether it ended, raised or was interrupted."""

    def __init__(self, items: Iterable[T], ahead: int = 1) -> None:
        self.items, self.ahead = items, ahead
        self.ready: collections.deque[tuple[Any, BaseException | None]] = collections.deque()
        self.turn = threading.Condition()
        self.stopping = self.finished = False
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._fill,), name="magmadnn-prefetch", daemon=True)
        self.thread.start()

    def _fill(self) -> None:
        """The thread: each item drawn, then handed over once there is room."""
        try:
            for item in self.items:
                if not self._hand((item, None)):
                    return
        except BaseException as exc:  # noqa: BLE001  raised again in the caller, at its item
            self._hand((None, exc))
        finally:
            with self.turn:
                self.finished = True
                self.turn.notify_all()

    def _hand(self, entry: tuple[Any, BaseException | None]) -> bool:
        with self.turn:
            self.turn.wait_for(lambda: len(self.ready) < self.ahead or self.stopping)
            if self.stopping:
                return False
            self.ready.append(entry)
            self.turn.notify_all()
            return True

    def __iter__(self) -> Iterator[T]:
        while True:
            with self.turn:
                self.turn.wait_for(lambda: bool(self.ready) or self.finished)
                if not self.ready:
                    return
                item, error = self.ready.popleft()
                self.turn.notify_all()
            if error is not None:
                raise error
            yield item

    def close(self) -> None:
        with self.turn:
            self.stopping = True
            self.turn.notify_all()
        self.thread.join()

    def __enter__(self) -> "Prefetch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prefetch_depth(device: str) -> int:
    """Batches to draw ahead on `device`: PREFETCH on the CPU, where a batch's gather and augmentation
    are host work a thread overlaps with the step's; none on a GPU, where they are device work queued
    in order with the step (and a CUDA graph reads its batch from fixed buffers)."""
    return PREFETCH if device == "cpu" else 0


@contextlib.contextmanager
def prefetched(items: Iterable[T], ahead: int = 1) -> Iterator[Iterable[T]]:
    """`items`, drawn ahead by a `Prefetch` thread where `ahead` > 0, else each when it is taken (the
    same items either way)."""
    if ahead <= 0:
        yield items
        return
    with Prefetch(items, ahead) as drawn:
        yield drawn
