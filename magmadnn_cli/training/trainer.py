"""The training loop, top to bottom: each step forward -> backward -> allreduce of gradients (and the
step's loss/accuracy sums, in the same buffer) -> the same update on every rank.

Data parallelism: `batch_size` is the global batch. Each epoch one seeded permutation is cut into
global batches; each rank takes its contiguous share of every batch, so every rank takes the same
number of steps. Local gradients are weighted by local/global sample count before the sum, so the
result equals the single-process gradient for any rank count, even for a short last batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from ..core import backend as B
from ..data.tables import Split
from ..distributed import Communicator, SingleProcess
from ..errors import DivergenceError, Interrupted
from .interrupts import StopSignals, resume_command
from .metrics import predicted_classes
from ..nn.network import Network
from ..nn.optimizers import Optimizer
from ..reporting import Reporter

Array = Any


def steps_per_epoch(rows: int, batch_size: int) -> int:
    return max(1, math.ceil(rows / batch_size))


@dataclass
class EarlyStopper:
    monitor: str
    patience: int
    min_delta: float
    restore_best: bool
    best: float = math.nan
    best_epoch: int = 0
    best_params: Array | None = None
    wait: int = 0

    @property
    def maximize(self) -> bool:
        return "accuracy" in self.monitor

    def update(self, epoch: int, metrics: dict[str, Any], params: Array) -> bool:
        """Record this epoch; True when training should stop."""
        value = metrics.get(self.monitor)
        if value is None:
            return False
        gain = (value - self.best) if self.maximize else (self.best - value)
        if math.isnan(self.best) or gain > self.min_delta:
            self.best, self.best_epoch, self.wait = value, epoch, 0
            if self.restore_best:
                self.best_params = params.copy()
            return False
        self.wait += 1
        return self.wait > self.patience


@dataclass
class History:
    epochs: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False
    pruned: bool = False
    best_epoch: int | None = None


@dataclass
class Position:
    """Where training stands: the epoch in progress, the steps of it done, and its running sums."""
    epoch: int = 1
    step: int = 0
    loss_sum: float = 0.0
    correct: float = 0.0
    seen: int = 0


class Checkpointer(Protocol):
    last: Path | None

    def due(self, global_step: int, epoch_done: int | None) -> bool: ...
    def write(self, trainer: "Trainer") -> Path: ...


class Trainer:
    def __init__(self, network: Network, optimizer: Optimizer | None, task: str, batch_size: int, seed: int,
                 shuffle: bool = True, comm: Communicator | None = None, reporter: Reporter | None = None,
                 eval_batch_size: int = 1024, augment: Callable[[Array, np.random.Generator], Array] | None = None,
                 checkpointer: Checkpointer | None = None, stop_on_signal: bool = False) -> None:
        self.net, self.opt, self.task = network, optimizer, task
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.comm = comm or SingleProcess()
        self.reporter = reporter or Reporter()
        self.eval_batch_size = eval_batch_size
        self.augment = augment
        self.checkpointer = checkpointer
        self.signals = StopSignals(stop_on_signal)
        self.stop_requested = False  # a rank caught SIGINT/SIGTERM (agreed through the step's allreduce)
        self.position = Position()
        self.history = History()
        self.stopper: EarlyStopper | None = None

    # -- one step ------------------------------------------------------------------------------
    def correct(self, y: Array) -> Array:
        """Correct predictions in the batch just run, from the logits (no extra forward pass)."""
        logits = self.net.logits.value
        if self.task == "classification":
            return (logits.argmax(axis=1) == y).sum()
        if self.task == "binary":
            return ((logits > (0.0 if self.net.fused else 0.5)) == (y > 0.5)).sum()
        return 0

    def step(self, x: Array, y: Array, global_count: int) -> tuple[float, float]:
        """Forward, backward, gradient allreduce, update. Returns the global (loss sum, correct)."""
        net = self.net
        count = len(x)
        if count:
            loss = net.forward_backward(x, y)
            if count != global_count:
                net.flat_grads *= count / global_count
            net.step_stats[0] = loss * count
            net.step_stats[1] = self.correct(y)
        else:  # this rank has no rows in a short last batch: it still joins the collective
            net.step_buffer.fill(0)
        net.step_stats[2] = 1.0 if self.signals.received else 0.0
        self.comm.allreduce_sum(net.step_buffer)
        loss_sum, correct, stop = (float(v) for v in B.to_host(net.step_stats))
        self.stop_requested = stop > 0
        if not math.isfinite(loss_sum):
            return loss_sum, correct
        assert self.opt is not None, "training needs an optimizer"
        self.opt.step(net.flat_params, net.flat_grads, self.comm.update_share(net.flat_params.size),
                      self.comm.sum_shares)
        self.comm.update_done()
        return loss_sum, correct

    # -- epochs --------------------------------------------------------------------------------
    def batches(self, n: int, epoch: int) -> list[np.ndarray]:
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        return [order[i:i + self.batch_size] for i in range(0, n, self.batch_size)]

    def steps_per_epoch(self, n: int) -> int:
        return steps_per_epoch(n, self.batch_size)

    @property
    def global_step(self) -> int:
        return self.opt.t if self.opt is not None else 0

    def run_epoch(self, train: Split, x: Array, y: Array) -> dict[str, float]:
        """The rest of the epoch at `self.position` (all of it, unless resumed mid-epoch)."""
        pos = self.position
        batches = self.batches(len(train.x), pos.epoch)
        for step in range(pos.step + 1, len(batches) + 1):
            batch = batches[step - 1]
            mine = np.array_split(batch, self.comm.size)[self.comm.rank]
            idx = B.to_device(mine)
            if self.augment is None or not len(mine):
                xb = x[idx]
            else:  # seeded per step and rank, so a resumed run draws what the uninterrupted one did
                xb = self.augment(x[idx], np.random.default_rng([self.seed, pos.epoch, step, self.comm.rank, 1]))
            l_sum, c = self.step(xb, y[idx], len(batch))
            if not math.isfinite(l_sum):
                raise DivergenceError(self._divergence(f"epoch {pos.epoch}, step {step}: the loss became "
                                                       f"{l_sum / len(batch)} (not finite)"))
            pos.step, pos.loss_sum, pos.correct, pos.seen = step, pos.loss_sum + l_sum, pos.correct + c, pos.seen + len(batch)
            self.reporter.step(pos.epoch, step, pos.loss_sum / pos.seen,
                               pos.correct / pos.seen if self.task != "regression" else None)
            if step < len(batches):
                self._checkpoint_if_due(None)
        metrics = {"loss": pos.loss_sum / pos.seen}
        if self.task != "regression":
            metrics["accuracy"] = pos.correct / pos.seen
        return metrics

    def fit(self, train: Split, validation: Split | None, epochs: int, stopper: EarlyStopper | None = None,
            prune: Callable[[int, dict[str, Any]], bool] | None = None) -> History:
        """Train from `self.position` (epoch 1, or where a checkpoint left off) to `epochs`;
        `prune(epoch, metrics)` returning True stops early (a hyperparameter search's poor trial)."""
        history, self.stopper = self.history, stopper
        x, y = B.to_device(train.x), B.to_device(train.y)
        self.reporter.start(epochs, self.steps_per_epoch(len(train.x)))
        # Overflow warnings are noise here: a non-finite loss is caught and reported by `run_epoch`.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), self.signals:
            try:
                while not history.stopped_early and self.position.epoch <= epochs:
                    epoch = self.position.epoch
                    self._epoch(train, validation, x, y)
                    self.position = Position(epoch + 1)
                    if stopper is not None and stopper.update(epoch, history.epochs[-1], self.net.flat_params):
                        history.stopped_early = True
                    elif prune is not None and prune(epoch, history.epochs[-1]):
                        history.stopped_early = history.pruned = True
                    self._checkpoint_if_due(epoch)
            finally:
                self.reporter.stop()
        if stopper is not None:
            history.best_epoch = stopper.best_epoch
            if stopper.best_params is not None:
                self.net.flat_params[...] = stopper.best_params
        return history

    def _epoch(self, train: Split, validation: Split | None, x: Array, y: Array) -> None:
        start = time.perf_counter()
        epoch = self.position.epoch
        lr = self.opt.schedule(float(epoch - 1)) if self.opt else 0.0  # the rate the epoch started with
        metrics = {"epoch": epoch, **self.run_epoch(train, x, y)}
        if validation is not None:
            val = self.evaluate(validation)
            metrics.update({f"val_{k}": v for k, v in val.items() if k in ("loss", "accuracy")})
        metrics["lr"] = lr
        metrics["time"] = time.perf_counter() - start
        self.history.epochs.append(metrics)
        self.reporter.epoch(epoch, {k: v for k, v in metrics.items() if k not in ("epoch", "time")})

    # -- checkpoints and interruption -----------------------------------------------------------
    def _checkpoint_if_due(self, epoch_done: int | None) -> None:
        """After a step (`epoch_done` None) or an epoch's end: write a checkpoint when one is due or
        a rank caught a signal; then stop if one did. Every rank takes the same decisions."""
        cp = self.checkpointer
        if cp is not None and (self.stop_requested or cp.due(self.global_step, epoch_done)):
            self.check_weights()
            cp.write(self)
        if self.stop_requested:
            where = f"epoch {self.position.epoch - 1} (completed)" if epoch_done else \
                f"epoch {self.position.epoch}, step {self.position.step}"
            name = self.signals.name or "a signal on another rank"
            if cp is None or cp.last is None:
                raise Interrupted(f"stopped by {name} at {where}; checkpoints are off (training.checkpoint), "
                                  "so nothing was saved", self.signals.received or 2)
            raise Interrupted(f"stopped by {name} at {where}; checkpoint written: {cp.last}\n"
                              f"Continue with: {resume_command(cp.last.parent.parent, self.comm.size)}",
                              self.signals.received or 2)

    def check_weights(self) -> None:
        """A non-finite gradient leaves non-finite weights: never checkpoint or save those."""
        if not bool(B.xp.isfinite(self.net.flat_params).all()):
            raise DivergenceError(self._divergence(f"after global step {self.global_step}: the weights are no "
                                                   "longer finite (a gradient overflowed)"))

    def _divergence(self, what: str) -> str:
        lr = f"{self.opt.lr():.3g}" if self.opt else "?"
        last = self.checkpointer.last if self.checkpointer is not None else None
        keep = (f" The last good checkpoint is {last}: resume from it with --resume {last} and a smaller "
                "--set optimizer.learning_rate=...") if last else ""
        return (f"{what}. Try a smaller learning rate (now {lr}), optimizer.clip_norm, or data.normalize: "
                f"standard. No model file was written.{keep}")

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, split: Split) -> dict[str, Any]:
        """Loss and accuracy over a split, sharded over ranks; sums are reduced, so exact. Also
        returns every row's output (gathered, in order) as `outputs`."""
        rows = np.array_split(np.arange(len(split.x)), self.comm.size)[self.comm.rank]
        loss_sum, outputs = 0.0, []
        for i in range(0, len(rows), self.eval_batch_size):
            part = rows[i:i + self.eval_batch_size]
            loss, out = self.net.loss_and_output(B.to_device(split.x[part]), B.to_device(split.y[part]))
            loss_sum += float(loss) * len(part)
            outputs.append(B.to_host(out))
        sums = B.xp.asarray([loss_sum], dtype=np.float64)
        self.comm.allreduce_sum(sums)
        gathered = [o for chunk in self.comm.allgather(outputs) for o in chunk]
        output = np.concatenate(gathered) if gathered else np.zeros((0,), np.float32)
        result: dict[str, Any] = {"loss": float(sums[0]) / len(split.x), "outputs": output}
        if self.task != "regression":
            truth = split.y.reshape(-1).astype(np.int64)
            result["accuracy"] = float((predicted_classes(output, self.task) == truth).mean())
        return result
