"""Asynchronous SGD with bounded staleness (`distributed.strategy: async`; the parameter server of
Dean et al. 2012's Downpour SGD, the bound of Ho et al. 2013's stale synchronous parallel).

Rank 0 is the server: it holds the weights and the optimizer state and applies every gradient it
receives as one optimizer step. Ranks 1..N-1 are workers: each takes a step (a whole batch of the
epoch, the one a single process would run at that step) with the weights it is served, computes the
gradient, sends it, and takes the next step it is given, never waiting for another worker. Fast
workers take more steps, a straggler fewer.

Steps are served in order, at most `bound + 1` at a time, and their gradients are applied in step
order. A gradient is therefore applied at most `bound` steps after the weights it was computed on
were served: its staleness. With bound 0 one step is computed at a time, on the current weights: one
process's run exactly (on any number of workers); with bound b, up to b + 1 workers compute at once.

A phase (an epoch, or its rest) is, per worker:
    worker -> server   None                                  joining the phase
    server -> worker   (step, buffers), then the weights      a step to compute
    worker -> server   (step, loss sum, correct, stop, buffers), then the gradient
    server -> worker   None                                  the phase is over
Batchnorm's running statistics come back with each gradient; the server keeps those of the step it
applies (exact with bound 0; with b > 0 they miss the other steps of that step's window). After the
phase every rank takes the server's weights, buffers and state (`agree`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..core import backend as B
from .comm import Communicator
from .data_parallel import DataParallel

Applied = Callable[[int, float, float], None]  # (step, loss sum, correct) after the server applies a step
Gradient = Callable[[int], tuple[float, float, bool]]  # a worker's step -> (loss sum, correct, stop asked)


@dataclass
class Pushed:
    """A worker's gradient for `step`, waiting for the steps before it."""
    step: int
    loss_sum: float
    correct: float
    buffers: dict[str, np.ndarray]
    grads: np.ndarray


@dataclass
class StalenessRecord:
    """What the server saw: steps applied per worker, and how stale their gradients were."""
    workers: int
    bound: int
    steps_per_worker: list[int] = field(default_factory=list)
    staleness_sum: int = 0
    staleness_max: int = 0

    def __post_init__(self) -> None:
        self.steps_per_worker = self.steps_per_worker or [0] * self.workers

    def add(self, worker: int, staleness: int) -> None:
        self.steps_per_worker[worker - 1] += 1
        self.staleness_sum += staleness
        self.staleness_max = max(self.staleness_max, staleness)

    def summary(self) -> dict[str, Any]:
        steps = sum(self.steps_per_worker)
        return {"workers": self.workers, "max_staleness": self.bound, "steps": steps,
                "steps_per_worker": list(self.steps_per_worker), "staleness_max": self.staleness_max,
                "staleness_mean": round(self.staleness_sum / max(1, steps), 3)}

    def describe(self) -> str:
        counts = [str(n) for n in self.steps_per_worker]
        listed = counts[0] if len(counts) == 1 else f"{', '.join(counts[:-1])} and {counts[-1]}"
        who = "worker 1" if self.workers == 1 else f"workers 1-{self.workers}"
        s = self.summary()
        return (f"asynchronous SGD: {who} took {listed} of the "
                f"{s['steps']} steps; gradients were applied {s['staleness_mean']:.2f} steps stale on average, "
                f"{s['staleness_max']} at most (max_staleness {self.bound})")


class AsyncParallel(DataParallel):
    """Rank 0 serves (`serve`), the others compute (`work`); `agree` ends a phase on every rank."""

    captures = False
    whole_gradient = False
    loop = "asynchronous"  # workers push, the server applies: `AsyncTrainer`

    def __init__(self, network: Any, optimizer: Any, comm: Communicator, max_staleness: int | None = None) -> None:
        super().__init__(network, optimizer, comm, sync_batchnorm=False)  # each worker has whole batches
        self.is_server = comm.is_root
        workers = comm.size - 1
        self.record = StalenessRecord(workers, 2 * workers if max_staleness is None else max_staleness)
        self.exact = self.record.bound == 0  # one process's run
        self.in_flight: dict[int, tuple[int, int]] = {}  # step -> (worker, steps applied when it was served)
        self.pending: dict[int, Pushed] = {}
        self.spare: list[np.ndarray] = []  # gradient buffers to reuse

    def layout(self) -> str:
        workers = self.record.workers
        return (f"asynchronous SGD: rank 0 serves the weights to {workers} worker{'s' * (workers > 1)}, each "
                f"gradient applied at most {self.record.bound} steps after its weights were served (max_staleness)")

    def summary(self) -> dict[str, Any]:
        return {"async_sgd": self.record.summary()}

    def strategy_used(self) -> str:
        return "async"

    def end_epoch(self) -> None:
        """Nothing to agree on: `agree` gave every rank the server's running statistics."""

    # -- the server ---------------------------------------------------------------------------------
    def serve(self, first: int, last: int, applied: Applied, stop_asked: Callable[[], bool]) -> bool:
        """Serve steps `first`..`last` and apply their gradients in order; after a stop request (a
        worker's or this rank's), serve no more and apply those in flight. Returns whether one came."""
        waiting: deque[int] = deque()  # workers waiting for a step
        served = done = first  # the next step to serve / to apply
        stop = False
        while True:
            while waiting and served <= last and not stop and served - done <= self.record.bound:
                self._serve_step(waiting.popleft(), served, done)
                served += 1
            if len(waiting) == self.record.workers and (done > last or (stop and done == served)):
                break
            worker, message = self.comm.recv_any()
            if message is not None:  # a gradient (None: the worker joins the phase)
                stop = self._receive(worker, message) or stop
                while done in self.pending:
                    self._apply(self.pending.pop(done), applied)
                    done += 1
            waiting.append(worker)
            stop = stop or stop_asked()
        for worker in waiting:
            self.comm.send(None, worker)
        return stop

    def _serve_step(self, worker: int, step: int, done: int) -> None:
        self.in_flight[step] = (worker, done)
        self.comm.send((step, _host(self.net.buffers())), worker)
        self.comm.send_array(self.net.flat_params, worker)

    def _receive(self, worker: int, message: tuple) -> bool:
        step, loss_sum, correct, stop, buffers = message
        grads = self.spare.pop() if self.spare else np.empty(self.net.flat_params.size, self.net.flat_params.dtype)
        self.comm.recv_array(grads, worker)
        self.pending[step] = Pushed(step, loss_sum, correct, buffers, grads)
        return bool(stop)

    def _apply(self, pushed: Pushed, applied: Applied) -> None:
        """One optimizer step with `pushed`'s gradient (not with a non-finite loss: `applied` then
        reports the divergence)."""
        worker, served_at = self.in_flight.pop(pushed.step)
        self.record.add(worker, pushed.step - served_at)
        if math.isfinite(pushed.loss_sum):
            _load(self.net.buffers(), pushed.buffers)
            self.optimizer.step(self.net.flat_params, B.to_device(pushed.grads))
        self.spare.append(pushed.grads)
        applied(pushed.step, pushed.loss_sum, pushed.correct)

    # -- a worker -----------------------------------------------------------------------------------
    def work(self, gradient: Gradient) -> None:
        """Compute the steps served until the phase is over; `gradient(step)` fills the network's
        flat gradients."""
        self.comm.send(None, 0)
        while (message := self.comm.recv(0)) is not None:
            step, buffers = message
            self.comm.recv_array(self.net.flat_params, 0)
            _load(self.net.buffers(), buffers)
            loss_sum, correct, stop = gradient(step)
            self.comm.send((step, loss_sum, correct, stop, _host(self.net.buffers())), 0)
            self.comm.send_array(self.net.flat_grads, 0)

    # -- every rank -------------------------------------------------------------------------------
    def agree(self, state: Any) -> Any:
        """After a phase: every rank takes the server's weights, buffers, step count and `state` (the
        optimizer's slots stay on the server, the only rank that updates or saves them)."""
        self.broadcast()
        self.optimizer.t, state = self.comm.bcast((self.optimizer.t, state))
        return state


def _host(buffers: dict[str, Any]) -> dict[str, np.ndarray]:
    return {name: B.to_host(value) for name, value in buffers.items()}


def _load(buffers: dict[str, Any], values: dict[str, np.ndarray]) -> None:
    for name, value in values.items():
        buffers[name][...] = B.to_device(value)
