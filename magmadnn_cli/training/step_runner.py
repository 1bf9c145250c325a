"""Runs the training step (`Trainer.train_step`): eagerly, or on a GPU as CUDA graphs.

With `training.cuda_graph: auto` on a GPU, every step runs on a created stream (capture is refused on
the legacy default one). The first step of each batch shape is a warm-up, run eagerly (it builds what
layers make on first use); the next is captured once, with static input buffers (the rows, targets and
positions), and each later step of that shape copies its batch into them (device to device) and
replays the graph. What changes from step to step lives in device memory, written before the step and
read by it: the learning rate and step count (`Optimizer.begin_step`), the epoch's random key and the
stop request. A step that cannot be captured runs eagerly, said once in the run log.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ..core import backend as B
from ..core.counter_random import derive_key

if TYPE_CHECKING:
    from .trainer import Trainer

Array = Any
Micro = list[tuple[Array, Array, Array]]


@dataclass
class Captured:
    """One batch shape's graph, the static buffers it reads and the statistics it leaves."""
    graph: Any
    inputs: Micro
    key: Array
    stop: Array
    stats: Array
    memory: list  # the blocks allocated while capturing, kept while the graph lives

    def feed(self, micro: Micro, key: int, stop: bool) -> None:
        for static, batch in zip(self.inputs, micro):
            for buffer, value in zip(static, batch):
                buffer[...] = value
        self.key[...] = np.uint64(key)
        self.stop[...] = float(stop)


class StepRunner:
    """The trainer's steps, eager or replayed (one graph per batch shape, after a warm-up step)."""

    def __init__(self, trainer: "Trainer", cuda_graph: bool) -> None:
        self.trainer = trainer
        self.on_gpu = B.current().device == "gpu"
        self.cuda_graph = cuda_graph and self.on_gpu
        self.stream = B.new_stream() if self.cuda_graph else None
        self.graphs: dict[tuple, Captured | None] = {}  # None: warmed up, not captured yet
        self.refused: str | None = None  # why steps run eagerly (said once)
        self.replays = 0

    @contextlib.contextmanager
    def streaming(self) -> Iterator[None]:
        """Every piece of a run's device work on the step's stream, in order with the replays. The
        stream first waits for what the legacy default stream has queued (the data's upload, the
        weights, a restored checkpoint: a created stream does not wait for it by itself), and is waited
        for at the end, before work on the default stream reads what it wrote."""
        if self.stream is None:
            yield
            return
        B.follow_default_stream(self.stream)
        try:
            with self.stream:
                yield
        finally:
            if self.stream.is_capturing():  # stopped inside a capture (a second signal)
                with contextlib.suppress(Exception):
                    self.stream.end_capture()
            self.stream.synchronize()

    def run(self, micro: Micro, count: int) -> Array:
        """One step on `micro` (this rank's batches of the update; `count` global rows): its statistics.
        The warm-up of a batch shape runs the very code the capture records (the optimizer's rate and
        count read from device memory), so whatever it builds on first use is built outside the graph."""
        t = self.trainer
        key, stop = derive_key(t.seed, t.position.epoch), bool(t.signals.received)
        shape = (tuple(tuple(x.shape) for x, _, _ in micro), count)
        if self.cuda_graph and self.refused is None and (why := t.parallel.can_capture()) is not None:
            self._refuse(why)
        if not self.cuda_graph or self.refused is not None:
            return t.train_step(micro, count, key, stop)
        t.opt.begin_step()
        if shape not in self.graphs:
            self.graphs[shape] = None
            return t.train_step(micro, count, key, stop, begun=True)  # the warm-up
        captured = self.graphs[shape] or self._capture(shape, micro, count)
        if captured is None:  # the capture failed: this step eagerly (said once)
            return t.train_step(micro, count, key, stop, begun=True)
        captured.feed(micro, key, stop)
        captured.graph.launch(self.stream)
        self.replays += 1
        return captured.stats

    def _capture(self, shape: tuple, micro: Micro, count: int) -> Captured | None:
        """Capture the step on static copies of `micro`'s buffers (None, said once, where it cannot be).
        Memory allocated while capturing stays the graph's (`B.graph_memory`); what the step uses from
        before (parameters, gradients, slots, the step buffer) is owned by their objects for the run."""
        t, xp = self.trainer, B.current().xp
        inputs = [tuple(a.copy() for a in batch) for batch in micro]
        key, stop = xp.zeros((), dtype=np.uint64), xp.zeros((), dtype=B.current().floatx)
        graph = None
        with B.graph_memory() as memory:
            self.stream.begin_capture()
            try:
                stats = t.train_step(inputs, count, key, stop, begun=True)
                graph = self.stream.end_capture()
            except Exception as exc:  # noqa: BLE001  cupy and the CUDA runtime raise several kinds; the step runs eagerly
                return self._refuse(f"{type(exc).__name__}: {exc}")
            finally:
                if graph is None and self.stream.is_capturing():
                    with contextlib.suppress(Exception):
                        self.stream.end_capture()
        captured = Captured(graph, inputs, key, stop, stats, memory)
        self.graphs[shape] = captured
        return captured

    def _refuse(self, why: str) -> None:
        self.refused = why
        self.trainer.reporter.info(f"training.cuda_graph: the step runs eagerly, not as a CUDA graph: {why}")
        return None
