"""The training loop of asynchronous SGD (`distributed.strategy: async`): within an epoch rank 0
serves steps and applies their gradients while the other ranks compute them (see
`distributed/async_sgd.py`); between epochs (evaluation, early stopping, checkpoints, the model
file) every rank runs the base trainer's code on the server's weights.

A step is a whole batch of the epoch, with the rows, random numbers and learning rate one process
gives it; the server records it as one process does, so its step checkpoints (written while the
workers compute) and its positions resume on any number of ranks and strategies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.counter_random import derive_key
from ..data.prepare import Split
from ..distributed.async_sgd import AsyncParallel
from ..errors import DivergenceError
from .history import History
from .trainer import Array, Trainer


class AsyncTrainer(Trainer):
    loop = "asynchronous"
    parallel: AsyncParallel
    diverged: str | None = None  # the server's divergence message, until every rank has it

    @property
    def shares(self) -> int:
        """A worker computes whole batches."""
        return 1

    def run_epoch(self, train: Split, x: Array, y: Array) -> dict[str, float]:
        batches = self.batches(len(train.x), self.position.epoch)
        stop, self.diverged = False, None
        if self.parallel.is_server:
            stop = self.parallel.serve(self.position.step + 1, len(batches),
                                       lambda step, loss_sum, correct: self._applied(batches, step, loss_sum, correct),
                                       lambda: bool(self.signals.received) or self.diverged is not None)
        else:
            self.parallel.work(lambda step: self._gradient(batches, step, x, y))
        self.position, stop, diverged = self.parallel.agree((self.position, stop, self.diverged))
        if diverged is not None:  # every rank stops with the server's message
            raise DivergenceError(diverged)
        self.stop_requested = stop or any(self.comm.allgather(bool(self.signals.received)))
        if self.stop_requested and self.position.step < len(batches):
            self._checkpoint_if_due(None)  # writes the checkpoint, then stops
        return self.epoch_metrics()

    def _gradient(self, batches: list[np.ndarray], step: int, x: Array, y: Array) -> tuple[float, float, bool]:
        """A worker: the gradient of the step's whole batch, into the network's flat gradients."""
        xb, yb, rows = self.rows_of(batches, step, x, y, 1, 0)
        loss = self.net.forward_backward(xb, yb, 1.0, rows, derive_key(self.seed, self.position.epoch))
        return float(loss) * len(rows), float(self.count_correct(yb)), bool(self.signals.received)

    def _applied(self, batches: list[np.ndarray], step: int, loss_sum: float, correct: float) -> None:
        """The server, after each step: count it, and write a step checkpoint when one is due. A
        divergence stops serving; the steps in flight are drained, then every rank raises it."""
        if self.diverged is not None:
            return
        try:
            self.record_step(step, len(batches), len(batches[step - 1]), loss_sum, correct, self.global_step)
            if step < len(batches):  # (stop_requested is agreed only after the phase: never set here)
                self._checkpoint_if_due(None)
        except DivergenceError as exc:
            self.diverged = str(exc)

    def fit(self, *args: Any, **kwargs: Any) -> History:
        history = super().fit(*args, **kwargs)
        self.reporter.info(self.parallel.record.describe())
        return history
