"""Data parallelism in one place (Horovod's DistributedOptimizer pattern): a wrapper around the
network's gradients and the optimizer that owns the initial broadcast (parameters and buffers), the
step buffer (the flat gradients plus the step's statistics, reduced by ONE allreduce), the update,
and batchnorm's reduction over ranks. The training loop calls `reduce` and `update` and has no
`if distributed` branches; the optimizer knows nothing of ranks.

`DataParallel` is the base: every rank holds and updates all the weights. Strategies refine it
(`shared.ShardedDataParallel`, `model_parallel.ModelParallel`, `async_sgd.AsyncParallel`); each
strategy's declaration in `strategies` picks its wrapper.
"""

from __future__ import annotations

from typing import Any

from ..core import backend as B
from .comm import Communicator

STATS = 3  # trailing slots of the step buffer: loss sum, correct count, stop request


class DataParallel:
    """Every rank keeps the whole model; gradients and statistics are summed by one allreduce and
    every rank applies the same update.

    `sync_batchnorm` (default): batchnorm layers use the statistics of the global batch (their sums
    are reduced in the forward and backward passes), so every rank ends with identical running
    statistics and N ranks compute what one process computes. Off: per-rank batch statistics (cheaper
    by a few small allreduces per layer and step; results then depend on the rank count), and the
    running statistics are averaged over ranks at every epoch's end so that every rank evaluates and
    saves the same model."""

    exact = True  # N ranks compute what one process computes
    loop = "synchronous"  # the training loop it needs (training/ runs it: `Trainer.loop`)
    captures = True  # a step of this strategy can be captured as a CUDA graph (its work stays on the device)
    whole_gradient = True  # after `reduce`, every rank holds the whole summed gradient

    def __init__(self, network: Any, optimizer: Any, comm: Communicator, sync_batchnorm: bool = True,
                 note: str | None = None) -> None:
        self.net, self.optimizer, self.comm = network, optimizer, comm  # comm: the ranks sharing gradients
        self.note = note  # what the run log says of how it came to this strategy (a fallback taken)
        self.world = comm  # every rank of the job (more than `comm` under model parallelism)
        self.sync_batchnorm = sync_batchnorm
        self._place()
        self.broadcast()
        network.mode.reduce = comm.allreduce_sum if comm.size > 1 and sync_batchnorm else None

    def _place(self) -> None:
        """The network's gradients become the front of the step buffer."""
        size = self.net.flat_params.size
        self.buffer = B.current().xp.zeros(size + STATS, dtype=self.net.flat_params.dtype)
        self.net.place(self.net.flat_params, self.buffer[:size])

    @property
    def stats(self) -> Any:
        return self.buffer[self.buffer.size - STATS:]

    def broadcast(self) -> None:
        """Every rank starts from rank 0's parameters and buffers."""
        self.comm.bcast_array(self.net.flat_params)
        for buffer in self.net.buffers().values():
            self.comm.bcast_array(buffer)

    def start_step(self, backward_passes: int) -> None:
        """Told before a step's backward passes how many there are (gradient accumulation: more
        than one); nothing to prepare here."""

    def reduce(self, loss_sum: Any, correct: Any, stop: Any) -> Any:
        """Sum the gradients (already weighted by each rank's share of the batch) and the step's
        statistics over ranks; returns the summed statistics (global loss sum, correct count, stop
        requests) where they live, without reading them."""
        stats = self.stats
        stats[0], stats[1], stats[2] = loss_sum, correct, stop if hasattr(stop, "dtype") else float(stop)
        return self._reduce_buffer()

    def _reduce_buffer(self) -> Any:
        """Sum the step buffer over ranks; returns the summed statistics."""
        self.comm.allreduce_sum(self.buffer)
        return self.stats

    def update(self, finite: Any = True, begun: bool = False) -> None:
        """The optimizer's step; skipped (on the device) unless `finite`, a device boolean. `begun`: its
        host part (`begin_step`) was taken already, outside a captured step."""
        if begun:
            self.optimizer.device_step(self.net.flat_params, self.net.flat_grads, finite)
        else:
            self.optimizer.step(self.net.flat_params, self.net.flat_grads, finite)

    def can_capture(self) -> str | None:
        """Why this step cannot be captured as a CUDA graph (None: it can): every part of it must stay
        on the device, the optimizer's update one kernel reading its rate and count from device memory."""
        if not self.captures:
            return f"the {self.strategy_used()} strategy's step runs on the host"
        if not self.comm.reduces_on_device():
            return "the gradients are summed through the host (MPI without NCCL)"
        if not self.optimizer.fusable():
            return f"the {self.optimizer.name} optimizer's update is not one kernel"
        return None

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state as one process would hold it (what checkpoints save)."""
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def layout(self) -> str | None:
        """A run-log line on how the ranks share the work (None: nothing to say beyond the rank count)."""
        return self.note

    def summary(self) -> dict[str, Any]:
        """What the run's metrics report of the strategy (nothing: every step is the same)."""
        return {}

    def strategy_used(self) -> str:
        """The strategy this wrapper carries out (what `auto` chose, or a fallback taken)."""
        return self.comm.reducer()

    def end_epoch(self) -> None:
        """With per-rank batch statistics, agree on the running statistics (their mean)."""
        if self.comm.size > 1 and not self.sync_batchnorm:
            for buffer in self.net.buffers().values():
                self.comm.allreduce_sum(buffer)
                buffer /= self.comm.size

