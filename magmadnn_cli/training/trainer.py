"""The training loop, top to bottom: each step forward -> backward -> one reduction of gradients and
the step's statistics -> the same update on every rank (through the data-parallel wrapper).

Data parallelism: `batch_size` is the global batch. Each epoch one seeded permutation is cut into
global batches; each rank takes its contiguous share of every batch, so every rank takes the same
number of steps. Each rank's backward pass is seeded with its share of the global batch (local /
global rows), so the summed gradient equals the single-process gradient for any rank count, even
for a short last batch. A row's random numbers (dropout, augmentation) are keyed by its position in
the epoch's global order, and batchnorm statistics are those of the global batch, so N ranks compute
what one process computes.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Protocol

import numpy as np

from ..core import backend as B
from ..core.counter_random import derive_key
from ..data.prepare import Split
from ..distributed.data_parallel import DataParallel
from ..errors import DivergenceError, Interrupted
from ..reporting import Reporter
from .. import signals
from ..signals import StopSignals
from .batches import BatchSchedule, prefetch_depth, prefetched, split_bounds
from .early_stopping import EarlyStopper
from .history import History, epochs_of
from .evaluation import evaluate_split
from ..data.targets import target_task
from .segments import Segments
from .loss_scale import loss_scaler
from .step_log import StepLog
from .step_runner import StepRunner
from . import advice

Array = Any
Augment = Callable[[Array, np.ndarray, int], Array]  # (batch, rows' global positions, epoch key) -> batch
Micro = list[tuple[Array, Array, Array]]  # this rank's (rows, targets, epoch positions) of each batch of an update
Update = tuple[int, Micro, int]  # (step, this rank's micro-batches, the update's global rows)


@dataclass
class Position:
    """Where training stands: the epoch in progress, the steps of it done, and its running sums."""
    epoch: int = 1
    step: int = 0
    loss_sum: float = 0.0
    correct: float = 0.0
    seen: int = 0


@dataclass(frozen=True)
class Plan:
    """How to train, from the config: the task, the global batch sizes by epoch, the seed (batch
    order, random numbers), the order, evaluation's batch size, augmentation, whether SIGINT /
    SIGTERM finish the step, checkpoint and stop, and whether a GPU replays steps as CUDA graphs."""
    task: str
    sizes: BatchSchedule
    seed: int
    shuffle: bool = True
    eval_batch_size: int = 1024
    augment: Augment | None = None
    stop_on_signal: bool = False
    cuda_graph: bool = False


class Checkpointer(Protocol):
    last: Path | None

    def due(self, global_step: int, epoch_done: int | None) -> bool: ...
    def write(self, trainer: "Trainer") -> Path: ...
    def newest(self) -> Path | None: ...
    def resumed(self, path: Path) -> None: ...


class Trainer:
    """Runs the loop for `parallel`'s network and optimizer as `plan` says, showing progress through
    `reporter` and writing checkpoints through `checkpointer`."""

    loop: ClassVar[str] = "synchronous"  # the strategy wrappers' `loop` this class runs

    def __init__(self, parallel: DataParallel, plan: Plan, reporter: Reporter | None = None,
                 checkpointer: Checkpointer | None = None, stopper: EarlyStopper | None = None,
                 origin: dict[str, str] | None = None) -> None:
        self.parallel, self.plan = parallel, plan
        self.net, self.opt, self.comm = parallel.net, parallel.optimizer, parallel.world
        self.data_comm = parallel.comm  # the ranks that split each batch (all, unless the model is split)
        self.task, self.sizes, self.seed = plan.task, plan.sizes, plan.seed
        self.target = target_task(plan.task)  # how its outputs are counted right
        self.reporter = reporter or Reporter()
        self.checkpointer = checkpointer
        self.signals = StopSignals(plan.stop_on_signal)
        self.stop_requested = False  # a rank caught SIGINT/SIGTERM (agreed through the step's reduction)
        self.position = Position()
        self.history = History()
        self.stopper = stopper  # training.early_stopping's (None: every epoch runs)
        self.conv_algorithms: dict[str, str] | None = None  # chosen before the first step, kept by checkpoints
        self.origin = origin  # the weights file it started from: path, sha256
        self.segments = Segments()  # the invocations that trained the run (kept by checkpoints)
        self._encoded: list[Any] = [None, []]  # (history epochs, their JSON lines so far): _epoch_lines
        self._summed: Array | None = None  # the gradients of an update's batches so far (accumulation)
        self.log = StepLog()  # the steps' statistics not yet read from the device
        self.order: Array | None = None  # the epoch's order of the training rows, on the device
        self.runner = StepRunner(self, plan.cuda_graph)  # eager steps, or CUDA graphs replayed
        self.done = 0  # the epoch's steps run so far (on a GPU ahead of `position`, which counts those read)
        self.scaler = loss_scaler(parallel)  # mixed_float16's dynamic loss scale (None otherwise)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where training stands (epoch, step, running sums) and the metrics history."""
        history = {k: v for k, v in vars(self.history).items() if k != "epochs"}
        return {"position": asdict(self.position), "history": history, "conv_algorithms": self.conv_algorithms,
                "history_epochs": self._epoch_lines(), "origin": self.origin, "segments": self.segments.state()}

    def _epoch_lines(self) -> np.ndarray:
        """The history's epochs as JSON lines (bytes): each epoch encoded once, when first
        checkpointed, so a checkpoint's cost does not grow with the epochs run (it did: 17 ms each
        after 1500 epochs, encoding them all again)."""
        epochs, encoded = self.history.epochs, self._encoded
        if encoded[0] is not epochs:  # a new or restored history
            encoded[:] = [epochs, []]
        encoded[1].extend(json.dumps(e).encode() for e in epochs[len(encoded[1]):])
        return np.frombuffer(b"\n".join(encoded[1]), np.uint8)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = Position(**state["position"])
        self.history = History(**{**state["history"], "epochs": epochs_of(state)})
        self.conv_algorithms = state.get("conv_algorithms")
        self.origin = state.get("origin")
        self.segments.load(state.get("segments"))

    def state_dicts(self) -> dict[str, dict[str, Any]]:
        """Every stateful object of a training, by owner: what a checkpoint holds."""
        owners = {"trainer": self.state_dict(), "network": self.net.state_dict(),
                  "optimizer": self.parallel.optimizer_state()}
        if self.stopper is not None:
            owners["early_stopping"] = self.stopper.state_dict()
        if self.scaler is not None:
            owners["loss_scale"] = self.scaler.state_dict()
        return owners

    def load_state_dicts(self, owners: dict[str, dict[str, Any]]) -> None:
        self.load_state_dict(owners["trainer"])
        self.net.load_state_dict(owners["network"])
        self.parallel.load_optimizer_state(owners["optimizer"])
        if self.stopper is not None and "early_stopping" in owners:
            self.stopper.load_state_dict(owners["early_stopping"])
        if self.scaler is not None and "loss_scale" in owners:
            self.scaler.load_state_dict(owners["loss_scale"])
        self.comm.barrier()  # state that ranks share in memory is written before anyone reads it

    # -- one step ------------------------------------------------------------------------------
    def count_correct(self, y: Array) -> Array:
        """Correct predictions in the batch just run, from the logits (no extra forward pass)."""
        return self.target.correct(self.net.logits.value, y, self.net.fused)

    def step(self, micro: Micro, global_count: int, epoch: int) -> tuple[float, float]:
        """`train_step` in `epoch` (its dropout key), its global (loss sum, correct) read back at once
        (a sweep's step, not the loop's)."""
        stats = self.train_step(micro, global_count, derive_key(self.seed, epoch), bool(self.signals.received))
        values = B.to_host(stats)
        self.stop_requested = bool(values[2] > 0)
        return float(values[0]), float(values[1])

    def train_step(self, micro: Micro, global_count: int, key: Any, stop: Any,
                   begun: bool = False) -> Array:
        """The training step, what a CUDA graph captures: forward and backward on each batch accumulated
        into this update (gradients summed, each seeded with its rows' share of the update's
        `global_count`; `key`, the epoch's random key, decides dropout), then one reduction (with `stop`,
        this rank's stop request) and the update, which the device skips when the loss is not finite
        (`begun`: the optimizer's host part is done, `StepRunner`). A rank with no rows in a short last
        batch still runs (on zero rows) to join every collective. Nothing is read back: returns the
        reduced statistics (global loss sum, correct count, stop requests) where they were computed."""
        loss_sum: Any = None
        correct: Any = None
        self.parallel.start_step(len(micro))
        for i, (x, y, positions) in enumerate(micro):
            seed = len(x) / global_count if self.scaler is None else self.scaler.scale * (len(x) / global_count)
            loss = self.net.forward_backward(x, y, seed, positions, key)
            part, hits = loss * len(x), self.count_correct(y)
            loss_sum, correct = (part, hits) if i == 0 else (loss_sum + part, correct + hits)
            if len(micro) > 1:
                self._accumulate(first=i == 0, last=i == len(micro) - 1)
        with self.comm.waiting(f"epoch {self.position.epoch}, step {self.done + 1}'s reduction"):
            stats = self.parallel.reduce(loss_sum, correct, stop)
            finite = B.array_module(stats).isfinite(stats[0])
            if self.scaler is not None:
                finite = self.scaler.unscale(self.net.flat_grads, finite)
            self.parallel.update(finite, begun)  # shared-memory strategies wait for the node's ranks here
        return stats

    def _accumulate(self, first: bool, last: bool) -> None:
        """Sum the batches' gradients of one update; the last puts the sum where the update reads it."""
        grads = self.net.flat_grads
        if first:
            if self._summed is None or self._summed.shape != grads.shape:
                self._summed = B.array_module(grads).empty_like(grads)
            self._summed[...] = grads
        else:
            self._summed += grads
        if last:
            grads[...] = self._summed

    # -- epochs --------------------------------------------------------------------------------
    def batches(self, n: int, epoch: int) -> list[np.ndarray]:
        """The epoch's update batches (each `gradient_accumulation_steps` batches of the batch size);
        the epoch's order goes to the device once, where each step takes its rows as a view of it."""
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.plan.shuffle else np.arange(n)
        self.order = B.to_device(order)
        size = self.sizes.update_size(epoch)
        return [order[i:i + size] for i in range(0, n, size)]

    @property
    def shares(self) -> int:
        """Into how many parts each batch is cut (one per rank of the data-parallel group)."""
        return self.data_comm.size

    @property
    def global_step(self) -> int:
        return self.opt.t

    def run_epoch(self, train: Split, x: Array, y: Array) -> dict[str, float]:
        """The rest of the epoch at `self.position` (all of it, unless resumed mid-epoch)."""
        batches = self.batches(len(train.x), self.position.epoch)
        updates = ((step, self.micro_batches(batches, step, x, y), len(batches[step - 1]))
                   for step in range(self.position.step + 1, len(batches) + 1))
        with prefetched(updates, prefetch_depth(B.current().device)) as ahead:  # the next one drawn meanwhile
            return self.run_steps(iter(ahead), len(batches))

    def run_steps(self, updates: Iterator[Update], steps: int) -> dict[str, float]:
        """Run each (step, this rank's micro-batches, global rows) update of an epoch of `steps`, in
        order: the one step loop, whatever feeds it (rows in memory, or streamed). Each step's
        statistics stay on the device until `self.log` is read: when full, at the epoch's end and
        before a checkpoint; a signal or a due checkpoint is acted on after the step."""
        self.done = self.position.step
        for step, micro, count in updates:
            stats = self.runner.run(micro, count)
            self.done = step
            self.log.add(stats, step, count, self.global_step)
            checkpoint = step < steps and self.checkpointer is not None and \
                self.checkpointer.due(self.global_step, None)
            if self.log.full or step == steps or checkpoint:
                self.read_steps(steps)
            if step < steps:
                self._checkpoint_if_due(None)
        return self.epoch_metrics()

    def read_steps(self, steps: int) -> None:
        """Count the steps kept on the device into the epoch, in order (one transfer)."""
        for record in self.log.read():
            self.stop_requested = record.stop
            self.record_step(record.step, steps, record.count, record.loss_sum, record.correct, record.global_step)

    def micro_batches(self, batches: list[np.ndarray], step: int, x: Array, y: Array) -> Micro:
        """This rank's share of each batch of the step's update, in order."""
        batch, size = batches[step - 1], self.sizes.size(self.position.epoch)
        first = (step - 1) * len(batches[0])
        return [self.share_of(first + lo, first + min(lo + size, len(batch)), x, y, self.shares, self.data_comm.rank)
                for lo in range(0, len(batch), size)]

    def rows_of(self, batches: list[np.ndarray], step: int, x: Array, y: Array, shares: int,
                share: int) -> tuple[Array, Array, Array]:
        """Share `share` of `shares` of the step's whole batch."""
        first = (step - 1) * len(batches[0])
        return self.share_of(first, first + len(batches[step - 1]), x, y, shares, share)

    def share_of(self, lo: int, hi: int, x: Array, y: Array, shares: int, share: int) -> tuple[Array, Array, Array]:
        """Share `share` of `shares` of the rows at positions [lo, hi) of the epoch's order, augmented,
        with those positions (which key their random numbers), all on the device."""
        a, b = split_bounds(lo, hi, shares, share)
        idx, positions = self.order[a:b], B.current().xp.arange(a, b)
        xb = x[idx]
        if self.plan.augment is not None:
            xb = self.plan.augment(xb, positions, derive_key(self.seed, self.position.epoch))
        return xb, y[idx], positions

    def record_step(self, step: int, steps: int, count: int, loss_sum: float, correct: float,
                    global_step: int) -> None:
        """Count a step's global loss sum and correct predictions into the epoch (a non-finite loss
        ends the training) and report the progress and the update's loss."""
        pos = self.position
        if not math.isfinite(loss_sum):
            raise DivergenceError(self._divergence(f"epoch {pos.epoch}, step {step}: the loss became "
                                                   f"{loss_sum / count} (not finite)"))
        pos.step, pos.loss_sum, pos.correct, pos.seen = step, pos.loss_sum + loss_sum, pos.correct + correct, pos.seen + count
        self.reporter.step(pos.epoch, step, steps, pos.loss_sum / pos.seen,
                           pos.correct / pos.seen if self.target.decl.labels else None)
        self.reporter.optimizer_step(global_step, loss_sum / count)

    def epoch_metrics(self) -> dict[str, float]:
        pos = self.position
        metrics = {"loss": pos.loss_sum / pos.seen}
        if self.target.decl.labels:
            metrics["accuracy"] = pos.correct / pos.seen
        return metrics

    def fit(self, train: Split, validation: Split | None, epochs: int,
            prune: Callable[[int, dict[str, Any]], bool] | None = None) -> History:
        """Train from `self.position` (epoch 1, or where a checkpoint left off) to `epochs`;
        `prune(epoch, metrics)` returning True stops early (a hyperparameter search's poor trial).
        With early stopping's restore_best, the network ends in the best epoch's state."""
        history, stopper = self.history, self.stopper
        x, y = B.to_device(train.x), B.to_device(train.y)
        if self.conv_algorithms is not None:  # chosen before the run (training/convolutions.py), or resumed
            self.net.set_conv_algorithms(self.conv_algorithms)
        self.reporter.start(epochs)
        # Overflow warnings are noise here: a non-finite loss is caught and reported by `run_epoch`.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), self.signals, self.runner.streaming():
            try:
                while not history.stopped_early and self.position.epoch <= epochs:
                    epoch = self.position.epoch
                    self._epoch(train, validation, x, y)
                    self.position = Position(epoch + 1)
                    if stopper is not None and stopper.update(epoch, history.epochs[-1], self.net):
                        history.stopped_early = True
                        self.reporter.info(stopper.announcement(epoch))
                    elif prune is not None and prune(epoch, history.epochs[-1]):
                        history.stopped_early = history.pruned = True
                    self._checkpoint_if_due(epoch)
            except KeyboardInterrupt:  # (a search's trial: its runner's signals.check() raises it again)
                raise self._stopped_at_once() from None
            finally:
                self.reporter.stop()
        if stopper is not None:
            history.best_epoch = stopper.best_epoch
            stopper.restore(self.net)
        return history

    def _epoch(self, train: Split, validation: Split | None, x: Array, y: Array) -> None:
        start = time.perf_counter()
        epoch = self.position.epoch
        lr = self.opt.schedule(float(epoch - 1))  # the rate the epoch started with
        metrics = {"epoch": epoch, **self.run_epoch(train, x, y)}
        self.parallel.end_epoch()
        if validation is not None:
            val = evaluate_split(self.net, validation, self.task, self.data_comm, self.plan.eval_batch_size)
            metrics.update({f"val_{k}": v for k, v in val.items() if k in ("loss", "accuracy")})
        metrics["lr"] = lr
        if self.sizes.changes:  # a growing batch: say each epoch's
            metrics["batch_size"] = self.sizes.size(epoch)
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
            raise Interrupted(advice.interrupted(name, where, cp.last if cp is not None else None, self.comm.size),
                              self.signals.received or 2)

    def _stopped_at_once(self) -> Interrupted:
        """A signal raised mid-step: with on_signal off, or a second one after the first (which means it)."""
        signum = signals.received() or signal.SIGINT
        why = ("a second signal" if self.signals.enabled else
               "training.checkpoint.on_signal is false" if self.checkpointer is not None else "checkpoints are off")
        where = f"epoch {self.position.epoch}, step {max(self.done, self.position.step)}"
        cp = self.checkpointer
        stopped = Interrupted(advice.stopped_at_once(signal.Signals(signum).name, where, cp.newest() if cp else None,
                                                     self.comm.size, why), signum)
        stopped.collective = self.comm.size == 1  # each rank stops where it is: under MPI, said and aborted
        return stopped

    def check_weights(self) -> None:
        """A non-finite gradient leaves non-finite weights: never checkpoint or save those."""
        if not bool(B.current().xp.isfinite(self.net.flat_params).all()):
            raise DivergenceError(self._divergence(f"after global step {self.global_step}: the weights are no "
                                                   "longer finite (a gradient overflowed)"))

    def _divergence(self, what: str) -> str:
        return advice.diverged(what, self.opt.lr(), self.checkpointer.last if self.checkpointer is not None else None)

