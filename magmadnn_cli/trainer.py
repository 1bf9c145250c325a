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
from typing import Any, Callable

import numpy as np

from . import backend as B
from .data import Split
from .distributed import Communicator, SingleProcess
from .errors import DivergenceError
from .metrics import predicted_classes
from .network import Network
from .optimizers import Optimizer
from .reporting import Reporter

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


class Trainer:
    def __init__(self, network: Network, optimizer: Optimizer | None, task: str, batch_size: int, seed: int,
                 shuffle: bool = True, comm: Communicator | None = None, reporter: Reporter | None = None,
                 eval_batch_size: int = 1024, augment: Callable[[Array, np.random.Generator], Array] | None = None) -> None:
        self.net, self.opt, self.task = network, optimizer, task
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.comm = comm or SingleProcess()
        self.reporter = reporter or Reporter()
        self.eval_batch_size = eval_batch_size
        self.augment = augment

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
        self.comm.allreduce_sum(net.step_buffer)
        loss_sum, correct = (float(v) for v in B.to_host(net.step_stats))
        if not math.isfinite(loss_sum):
            return loss_sum, correct
        assert self.opt is not None, "training needs an optimizer"
        self.opt.step(net.flat_params, net.flat_grads)
        return loss_sum, correct

    # -- epochs --------------------------------------------------------------------------------
    def batches(self, n: int, epoch: int) -> list[np.ndarray]:
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        return [order[i:i + self.batch_size] for i in range(0, n, self.batch_size)]

    def steps_per_epoch(self, n: int) -> int:
        return steps_per_epoch(n, self.batch_size)

    def run_epoch(self, train: Split, epoch: int, x: Array, y: Array) -> dict[str, float]:
        loss_sum = correct = 0.0
        seen = 0
        rng = np.random.default_rng([self.seed, epoch, self.comm.rank, 1])  # augmentation draws
        for step, batch in enumerate(self.batches(len(train.x), epoch), start=1):
            mine = np.array_split(batch, self.comm.size)[self.comm.rank]
            idx = B.to_device(mine)
            xb = x[idx] if self.augment is None or not len(mine) else self.augment(x[idx], rng)
            l_sum, c = self.step(xb, y[idx], len(batch))
            if not math.isfinite(l_sum):
                raise DivergenceError(
                    f"epoch {epoch}, step {step}: the loss became {l_sum / len(batch)} (not finite). "
                    f"Try a smaller learning rate (now {self.opt.lr() if self.opt else 0:.3g}), optimizer.clip_norm, "
                    "or data.normalize: standard. No output files were written.")
            loss_sum += l_sum
            correct += c
            seen += len(batch)
            self.reporter.step(epoch, step, loss_sum / seen, correct / seen if self.task != "regression" else None)
        metrics = {"loss": loss_sum / seen}
        if self.task != "regression":
            metrics["accuracy"] = correct / seen
        return metrics

    def fit(self, train: Split, validation: Split | None, epochs: int, stopper: EarlyStopper | None = None,
            first_epoch: int = 1, prune: Callable[[int, dict[str, Any]], bool] | None = None) -> History:
        """Train; `prune(epoch, metrics)` returning True stops early (a hyperparameter search's poor trial)."""
        history = History()
        x, y = B.to_device(train.x), B.to_device(train.y)
        self.reporter.start(epochs, self.steps_per_epoch(len(train.x)))
        # Overflow warnings are noise here: a non-finite loss is caught and reported by `run_epoch`.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            try:
                for epoch in range(first_epoch, epochs + 1):
                    self._epoch(epoch, train, validation, x, y, history)
                    if stopper is not None and stopper.update(epoch, history.epochs[-1], self.net.flat_params):
                        history.stopped_early = True
                        break
                    if prune is not None and prune(epoch, history.epochs[-1]):
                        history.stopped_early = history.pruned = True
                        break
            finally:
                self.reporter.stop()
        if stopper is not None:
            history.best_epoch = stopper.best_epoch
            if stopper.best_params is not None:
                self.net.flat_params[...] = stopper.best_params
        return history

    def _epoch(self, epoch: int, train: Split, validation: Split | None, x: Array, y: Array,
               history: History) -> None:
        start = time.perf_counter()
        lr = self.opt.lr()
        metrics = {"epoch": epoch, **self.run_epoch(train, epoch, x, y)}
        if validation is not None:
            val = self.evaluate(validation)
            metrics.update({f"val_{k}": v for k, v in val.items() if k in ("loss", "accuracy")})
        metrics["lr"] = lr
        metrics["time"] = time.perf_counter() - start
        history.epochs.append(metrics)
        self.reporter.epoch(epoch, {k: v for k, v in metrics.items() if k not in ("epoch", "time")})

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
