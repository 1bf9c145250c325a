"""The distributed strategies (`distributed.strategy`), one declaration each: its name, what it does,
the communicator its ranks use, the wrapper that reduces and applies gradients, and what it supports.
Everything outside distributed/ asks the strategy (`strategy_of(config)`) for a fact instead of
comparing its name; adding a strategy is one entry here (and its name in the config's vocabulary).

The implementations load when used: this module imports neither numpy (the launcher limits BLAS
threads before numpy loads) nor mpi4py (which initializes MPI on import).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConfigError
from .comm import Communicator, SingleProcess, joined, launched_ranks

if TYPE_CHECKING:
    from .data_parallel import DataParallel
    from .model_parallel import ModelGroups

# (network, optimizer, comm, groups, the config's distributed section) -> the optimizer wrapper
Wrapper = Callable[[Any, Any, Communicator, "ModelGroups", Any], "DataParallel"]
Problem = tuple[tuple[str, ...], str]  # (config path, what is wrong and the fix)


@dataclass(frozen=True)
class Strategy:
    """One strategy. `communicator()` makes this rank's communicator under a launcher of 2+ ranks;
    `wrapper(...)` the optimizer wrapper (`DataParallel` or a subclass) for a built network."""
    name: str
    description: str
    communicator: Callable[[], Communicator]
    wrapper: Wrapper
    exact_on_any_rank_count: bool = True  # N ranks end with one process's weights (to float rounding)
    model_parallel: bool = True  # distributed.model_parallel > 1 may split its layers
    whole_model: str = ""  # why it cannot split layers (when not model_parallel)
    stale_gradients: bool = False  # applies gradients computed on older weights (takes max_staleness)
    min_ranks: int = 1  # fewer ranks train synchronously, as one process
    roles: str = ""  # what the min_ranks ranks are, for the message

    def too_few_ranks(self, ranks: int) -> str | None:
        """The warning for a run on fewer ranks than the strategy needs (None: enough)."""
        if ranks >= self.min_ranks:
            return None
        return (f"distributed.strategy {self.name} needs {self.min_ranks} ranks or more ({self.roles}); this run "
                f"has {ranks} process{'es' * (ranks > 1)}, so it trains synchronously")


# -- communicators -------------------------------------------------------------------------------
def _mpi(reduction: str) -> Callable[[], Communicator]:
    def make() -> Communicator:
        from .mpi import MPICommunicator  # mpi4py initializes MPI on import
        return MPICommunicator(reduction)
    return make


def _node_memory(across_nodes: bool) -> Callable[[], Communicator]:
    def make() -> Communicator:
        from .shared import SharedMemoryCommunicator  # imports mpi4py
        return SharedMemoryCommunicator(across_nodes=across_nodes)
    return make


# -- wrappers ------------------------------------------------------------------------------------
def _synchronous(network: Any, optimizer: Any, comm: Communicator, groups: ModelGroups, dist: Any) -> DataParallel:
    """Every rank applies the same update: model parallel when `groups` split the layers."""
    from .data_parallel import DataParallel  # numpy: loaded when used
    from .model_parallel import ModelParallel
    if groups.model_ranks > 1:
        return ModelParallel(network, optimizer, groups, dist.sync_batchnorm)
    return DataParallel(network, optimizer, comm, dist.sync_batchnorm)


def _sharded(network: Any, optimizer: Any, comm: Communicator, groups: ModelGroups, dist: Any) -> DataParallel:
    """One copy per node in shared memory where the communicator is made for it and it can (CPU,
    room in /dev/shm); else MPI's allreduce."""
    if comm.size > 1:
        from .shared import ShardedDataParallel, SharedMemoryCommunicator, shared_memory_refusal
        if isinstance(comm, SharedMemoryCommunicator):
            why = shared_memory_refusal(network, optimizer, comm)
            if why is None:
                return ShardedDataParallel(network, optimizer, comm, dist.sync_batchnorm)
            if groups.model_ranks == 1:  # the fallback is said in the run log
                from .data_parallel import DataParallel as Fallback
                return Fallback(network, optimizer, comm, dist.sync_batchnorm, note=f"distributed: {why}")
    return _synchronous(network, optimizer, comm, groups, dist)


def _asynchronous(network: Any, optimizer: Any, comm: Communicator, groups: ModelGroups, dist: Any) -> DataParallel:
    """Rank 0 serves, the others compute; one process trains synchronously."""
    if comm.size > 1:
        from .async_sgd import AsyncParallel
        return AsyncParallel(network, optimizer, comm, dist.max_staleness)
    return _synchronous(network, optimizer, comm, groups, dist)


def resolve_auto(comm: Communicator, groups: ModelGroups) -> Strategy:
    """`auto`'s rule: shared_memory when several ranks all share one node, compute on the CPU and
    keep whole layers (and no loss scale needs the whole gradient on every rank: mixed_float16); else
    allreduce."""
    from ..core import backend as B
    one_node = 1 < comm.size == comm.local_size
    shared = one_node and B.current().device == "cpu" and groups.model_ranks == 1 and B.current().half != "float16"
    return STRATEGIES["shared_memory" if shared else "allreduce"]


def _auto(network: Any, optimizer: Any, comm: Communicator, groups: ModelGroups, dist: Any) -> DataParallel:
    return resolve_auto(comm, groups).wrapper(network, optimizer, comm, groups, dist)


# -- the registry --------------------------------------------------------------------------------
STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("auto", "shared_memory when every rank is on one node and computes on the CPU with whole layers "
             "(not under mixed_float16); else allreduce (the rule: resolve_auto)", _node_memory(across_nodes=False), _auto),
    Strategy("allreduce", "MPI's own Allreduce of one flat gradient buffer per step (NCCL between GPUs)",
             _mpi("allreduce"), _synchronous),
    Strategy("ring", "ring allreduce by point to point: N-1 reduce-scatter then N-1 allgather steps",
             _mpi("ring"), _synchronous),
    Strategy("parameter_server", "rank 0 sums every rank's gradients (MPI Reduce) and broadcasts the sum",
             _mpi("parameter_server"), _synchronous),
    Strategy("shared_memory", "one copy of the weights and optimizer state per node in shared memory; the "
             "node's ranks split the reduction and the update", _node_memory(across_nodes=True), _sharded,
             model_parallel=False, whole_model="keeps one whole copy of the weights per node"),
    Strategy("async", "asynchronous SGD: rank 0 serves the weights, the other ranks send gradients without "
             "waiting for one another", _mpi("allreduce"), _asynchronous,  # allreduce: evaluation's sums
             exact_on_any_rank_count=False, model_parallel=False, whole_model="serves whole models from one rank",
             stale_gradients=True, min_ranks=2, roles="a server and a worker"),
)}


def strategy_of(config: Any) -> Strategy:
    """The strategy a config (`Config`) names."""
    return STRATEGIES[config.distributed.strategy]


def get_communicator(strategy: str = "auto") -> Communicator:
    """This process's communicator: the strategy's under a launcher of 2+ ranks, else SingleProcess;
    made once (later calls return it)."""
    return joined(lambda: STRATEGIES[strategy].communicator() if launched_ranks() > 1 else SingleProcess())


# -- what a config may ask of its strategy ----------------------------------------------------------
def config_problems(config: Any) -> list[Problem]:
    """The distributed section's options that its strategy does not support, each located at the
    section with its fix (`config.loading` adds the file and line)."""
    dist = config.distributed
    strategy, problems = STRATEGIES[dist.strategy], []
    if dist.model_parallel > 1 and not strategy.model_parallel:
        fits = _names(lambda s: s.model_parallel)
        problems.append(f"strategy {strategy.name} {strategy.whole_model}; model_parallel > 1 splits them: use "
                        f"strategy {fits}, or model_parallel: 1")
    if dist.max_staleness is not None and not strategy.stale_gradients:
        problems.append(f"max_staleness bounds asynchronous SGD; strategy is {strategy.name!r}: set strategy: "
                        f"{_names(lambda s: s.stale_gradients)}, or remove max_staleness")
    located = [(("distributed",), problem) for problem in problems]
    if config.training.gradient_accumulation_steps > 1 and strategy.stale_gradients:
        located.append((("training", "gradient_accumulation_steps"),
                        f"strategy {strategy.name} applies each worker's batch as it arrives, so it accumulates "
                        f"nothing: use strategy {_names(lambda s: not s.stale_gradients)}, or "
                        "gradient_accumulation_steps: 1"))
    return located


def checked_strategy(config: Any) -> Strategy:
    """The config's strategy, after refusing options it does not support (a ConfigError, exit 2)."""
    problems = config_problems(config)
    if problems:
        raise ConfigError("\n".join(f"{'.'.join(path)}: {problem}" for path, problem in problems))
    return strategy_of(config)


def _names(fact: Callable[[Strategy], bool]) -> str:
    """The strategies with `fact`, as a message lists them: "auto, allreduce or ring"."""
    names = [s.name for s in STRATEGIES.values() if fact(s)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
