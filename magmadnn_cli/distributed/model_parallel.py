"""Model and hybrid parallelism (MagmaDNN section 4.1, dMath): `distributed.model_parallel: K` splits
every dense layer's units over K ranks; the world's ranks form D = size / K data-parallel groups of K
model-parallel ranks (rank = d K + k: consecutive ranks share a model, as on one node).

Inside a group the K ranks run the same rows: each computes its columns of a split layer, the
activations are allgathered over the group (forward) and the input gradients summed over it
(backward), so every rank holds the whole activations and any layer between split ones (dropout,
batchnorm, convolutions) runs replicated. Across groups it is data parallelism: each rank's
gradients (its columns, plus the replicated layers) are summed with the ranks holding the same part
in every other group. The result is a one-process run's, to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core import backend as B
from ..errors import MagmaError
from .comm import Communicator, SingleProcess
from .data_parallel import DataParallel


@dataclass
class ModelGroups:
    """The communicators of a hybrid layout: `model` (this rank's K-rank group, which splits the
    layers) and `data` (the D ranks holding the same part of the model, one per group)."""
    world: Communicator
    model: Communicator
    data: Communicator

    @property
    def model_ranks(self) -> int:
        """How many ranks share one copy of the model (each holding part of its layers)."""
        return self.model.size


def model_groups(world: Communicator, split: int) -> ModelGroups:
    """D = world.size / `split` groups of `split` consecutive ranks; one process keeps layers whole."""
    if world.size == 1 or split == 1:
        return ModelGroups(world, SingleProcess(), world)
    if world.size % split:
        raise MagmaError(f"distributed.model_parallel: {split} does not divide the {world.size} ranks; run a "
                         f"multiple of {split} ranks (e.g. {split * max(1, world.size // split)}), or set "
                         "model_parallel to a divisor of the rank count")
    group, part = divmod(world.rank, split)
    return ModelGroups(world, world.split(group, part), world.split(part, group))


class ModelParallel(DataParallel):
    """Data parallelism over `groups.data` of a network whose dense layers are split over
    `groups.model`. Gradient sums, batchnorm's statistics and the broadcast run over the data
    group; the stop request over every rank; the clip norm counts each split tensor's parts once."""

    captures = False
    whole_gradient = False

    def __init__(self, network: Any, optimizer: Any, groups: ModelGroups, sync_batchnorm: bool = True) -> None:
        self.groups = groups
        super().__init__(network, optimizer, groups.data, sync_batchnorm)
        self.world = groups.world

    def _reduce_buffer(self) -> Any:
        stats = super()._reduce_buffer()
        self.groups.model.allreduce_sum(stats[2:3])  # a signal caught by any rank of the group stops all
        return stats

    def update(self, finite: Any = True, begun: bool = False) -> None:
        """The update of this rank's parts (none unless `finite`; read on the host: a GPU waits here)."""
        if not finite:
            return
        opt, net = self.optimizer, self.net
        opt.ensure_state(net.flat_params)
        if opt.clip_norm is not None:
            opt.clip(net.flat_grads, self._squared_norm(net.flat_grads))
        opt.apply(net.flat_params, net.flat_grads, opt.state, total=self._sum_split_norms)

    def _sum_split_norms(self, squares: np.ndarray) -> np.ndarray:
        """Layer-wise rules' per-tensor squared norms (rows): a split tensor's are summed over the group."""
        split = np.array([spec.part is not None for spec in self.net.parameter_specs])
        if split.any():
            parts = np.ascontiguousarray(squares[split], dtype=np.float64)
            self.groups.model.allreduce_sum(parts)
            squares[split] = parts
        return squares

    def _squared_norm(self, flat: Any) -> float:
        """The whole gradient's squared norm: split parts summed over the group, replicated ones once."""
        whole, split = 0.0, np.zeros(1)
        for piece, is_split in self.net.flat_pieces(flat):
            squared = float(B.array_module(piece).vdot(piece, piece))
            if is_split:
                split[0] += squared
            else:
                whole += squared
        self.groups.model.allreduce_sum(split)
        return whole + float(split[0])

    def layout(self) -> str:
        """The run log's line: the layout, and how much of the model each rank holds."""
        held, total, split = self.net.local_parameters, self.net.num_parameters, self.groups.model_ranks
        groups = self.groups.world.size // split
        return (f"model parallel: {groups} data-parallel group{'s' * (groups > 1)} x {split} model-parallel ranks "
                f"(dense layers' units split {split} ways); each rank holds {held:,} of the {total:,} parameters "
                f"({held / total:.0%})")

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state with every slot in the whole model's layout (as one process has it)."""
        state = self.optimizer.state_dict()
        return {k: self.net.gather_flat(v) if k.startswith("slots/") else v for k, v in state.items()}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict({k: self.net.part_of_flat(v) if k.startswith("slots/") else v
                                        for k, v in state.items()})
