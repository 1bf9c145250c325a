"""The training loop over streamed epochs (`data.stream`, issue 48): the same steps as `Trainer`,
each update's rows taken from the file as `StreamSource.epoch` gives them (blocks in the seed and
epoch's order, rows mixed in a bounded buffer) instead of from one permutation of rows in memory."""

from __future__ import annotations

from typing import Any, Callable

from ..core import backend as B
from ..data.prepare import Split
from ..data.stream_prepare import InOrder, StreamSource
from .batches import rebatched, split_bounds
from .early_stopping import EarlyStopper
from .trainer import Array, History, Trainer


class StreamTrainer(Trainer):
    """`Trainer` whose epochs stream: the training `Split` holds `InOrder` rows (its source is read)."""

    source: StreamSource
    _first = 0  # the epoch position of the current update's first row
    _rows: tuple[Array, Array] | None = None  # the current update's rows, on the device

    def fit(self, train: Split, validation: Split | None, epochs: int, stopper: EarlyStopper | None = None,
            prune: Callable[[int, dict[str, Any]], bool] | None = None) -> History:
        assert isinstance(train.x, InOrder)
        self.source, self.rows = train.x.source, len(train.x)
        return super().fit(Split(train.x[:0], train.y[:0]), validation, epochs, stopper, prune)

    def run_epoch(self, train: Split, x: Array, y: Array) -> dict[str, float]:
        """The epoch's updates, read as they come (a streamed epoch is run whole: it is not resumed)."""
        epoch = self.position.epoch
        steps, size = self.sizes.steps(self.rows, epoch), self.sizes.update_size(epoch)
        pieces = ((xb, yb) for _, xb, yb in self.source.epoch(epoch, self.plan.shuffle))
        self.done, self._first = 0, 0
        for step, (xb, yb) in enumerate(rebatched(pieces, size), 1):
            self._rows = (B.to_device(xb), B.to_device(yb))
            batch = self.sizes.size(epoch)
            micro = [self.share_of(self._first + lo, self._first + min(lo + batch, len(xb)), x, y, self.shares,
                                   self.data_comm.rank) for lo in range(0, len(xb), batch)]
            stats = self.runner.run(micro, len(xb))
            self.done = step
            self.log.add(stats, step, len(xb), self.global_step)
            if self.log.full:
                self.read_steps(steps)
            self._first += len(xb)
            if step < steps:
                self._checkpoint_if_due(None)  # a signal stops the run here, not at the epoch's end
        self.read_steps(steps)
        self._rows = None
        return self.epoch_metrics()

    def share_of(self, lo: int, hi: int, x: Array, y: Array, shares: int, share: int) -> tuple[Array, Array, Array]:
        """Share `share` of the epoch positions [lo, hi) of the current update (which holds them)."""
        if self._rows is None:
            return super().share_of(lo, hi, x, y, shares, share)
        a, b = split_bounds(lo, hi, shares, share)
        xb, yb = self._rows
        return xb[a - self._first:b - self._first], yb[a - self._first:b - self._first], B.current().xp.arange(a, b)
