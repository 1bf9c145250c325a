"""From a validated config to the runtime objects of a run: each component's declaration goes to the
implementation registered for it; `build_run` assembles data, network, optimizer, the strategy's
wrapper and the trainer (the commands orchestrate; `run_checks.py` holds the checks it calls)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence


from ..config.schema import Config
from ..core import backend as B
from ..data.augment import augment
from ..data.prepare import Prepared, class_weights, prepare
from ..data.columns import Embedded
from ..data.stream_prepare import prepare_streamed, streaming, within_memory
from ..distributed import Communicator, strategies
from ..distributed.comm import on_every_rank
from ..distributed.stream_ranks import fit_ranks
from ..distributed.model_parallel import ModelGroups, model_groups
from ..errors import MagmaError
from ..nn.embedding import ColumnEmbeddings
from ..nn.layers import build_layers
from ..nn.losses import LOSSES, Loss
from ..nn.network import Network
from ..nn.optimizers import OPTIMIZERS, Optimizer
from ..reporting import Reporter
from .async_trainer import AsyncTrainer
from .batches import BatchSchedule
from .checkpoint import Saver, starting_weights, weights_origin
from .convolutions import choose_convolutions
from .early_stopping import EarlyStopper
from .stream_trainer import StreamTrainer
from .run_checks import check_memory, check_run
from .run_folder import RunFolder
from .history import History
from .trainer import Plan, Trainer


@dataclass
class Run:
    """Everything a training needs, built and checked before its first step."""
    config: Config
    comm: Communicator
    backend: B.Backend
    data: Prepared
    network: Network
    trainer: Trainer
    saver: Saver | None

    @property
    def task(self) -> str:
        return self.trainer.task

    @property
    def resolved(self) -> Config:
        """The config as this run runs it: each auto or fastest convolution pinned once chosen."""
        chosen = self.trainer.conv_algorithms
        return self.config.with_convolutions(list(chosen.values())) if chosen else self.config

    def choose_convolutions(self) -> None:
        """The convolutions' algorithms, before the first step (a resumed run keeps its checkpoint's)."""
        choose_convolutions(self.trainer, self.data.train.x)

    def fit(self, prune: Any = None) -> History:
        """Choose the convolutions' algorithms (unless chosen), then train to `training.epochs` (from
        where a resumed checkpoint left off)."""
        self.choose_convolutions()
        return self.trainer.fit(self.data.train, self.data.validation, self.config.training.epochs, prune)


def select_backend(config: Config, comm: Communicator) -> B.Backend:
    """The backend the config asks for, chosen alike on every rank (GPU ranks by node-local rank);
    `backend.using` makes it the run's."""
    backend = on_every_rank(comm, lambda: B.select(config.device, config.precision, config.memory))
    if backend.device == "gpu":
        with B.using(backend):
            B.use_gpu_device(comm.local_rank)
    return backend


def build_run(config: Config, comm: Communicator, reporter: Reporter, folder: RunFolder | None = None,
              init_from: Path | None = None, fold: tuple[int, int] | None = None,
              sweep: Callable[[int], float] | None = None) -> Run:
    """Read and split the data (fold k of K: its test split), build the network, optimizer, the
    strategy's wrapper and the trainer on the current backend, and make every check a run makes
    before its first step (`validate` runs exactly this). `folder`: the run folder its checkpoints
    (and metrics.csv beside them) go to; `sweep`: each step's learning rate in place of the
    schedule (lr-find's range test)."""
    seed = config.run_seed
    strategy = strategies.checked_strategy(config)
    streamed = streaming(config, comm.size, fold, strategy.stale_gradients)  # data.stream: epochs read from the file (issue 48)
    data = within_memory(config.data, True, "reading and encoding the data", lambda: prepare_streamed(
        config.data, config.loss.task, seed, ranks=fit_ranks(comm))) if streamed else prepared_data(
        comm, lambda: within_memory(config.data, False, "reading and encoding the data", lambda:
                                    prepare(config.data, config.loss.task, seed, fold)))  # streamed: every rank fits its share
    config = config.with_data_settled(data.settled)  # what the data file said: saved, so new files are read alike
    groups = parallel_layout(config, comm, reporter, strategy)
    network, optimizer = on_every_rank(comm, lambda: network_and_optimizer(config, data, seed, groups, init_from, sweep))
    parallel = strategy.wrapper(network, optimizer, comm, groups, config.distributed)
    policy = config.training.checkpoint if folder is not None else None
    saver = Saver(folder, policy, config, data.train, comm) if folder is not None and policy else None
    loop = StreamTrainer if streamed else {t.loop: t for t in (Trainer, AsyncTrainer)}[parallel.loop]  # the strategy's
    es = config.training.early_stopping
    stopper = EarlyStopper(es.monitor, es.patience, es.min_delta, es.restore_best) if es else None
    trainer = loop(parallel, plan(config, saver, data.task), reporter, saver, stopper,
                   weights_origin(init_from) if init_from is not None else None)
    return Run(config, comm, B.current(), data, network, trainer, saver)


def prepared_data(comm: Communicator, make: Any) -> Prepared:
    """`make()`'s data: under MPI prepared once per node and mapped by its other ranks (issue 48)."""
    if comm.size == 1 or not hasattr(comm, "owned"):
        return on_every_rank(comm, make)
    from ..distributed.shared import once_per_node  # imports mpi4py: only under MPI
    return once_per_node(comm, make)


def plan(config: Config, saver: Saver | None, task: str) -> Plan:
    """The training section as the trainer's plan (signals stop a run only when it checkpoints);
    `task`: the loss's task as the data make it (`Prepared.task`)."""
    training, aug = config.training, config.training.augment
    policy = training.checkpoint
    return Plan(task, batch_schedule(config), config.run_seed, training.shuffle, training.eval_batch_size,
                (lambda xb, rows, key: augment(xb, rows, key, aug.crop_padding, aug.horizontal_flip)) if aug else None,
                stop_on_signal=bool(saver is not None and policy and policy.on_signal),
                cuda_graph=training.cuda_graph == "auto")


def network_and_optimizer(config: Config, data: Prepared, seed: int, groups: ModelGroups, init_from: Path | None,
                          sweep: Callable[[int], float] | None = None) -> tuple[Network, Optimizer]:
    """The network (checked against the data, --init-from's weights loaded) and its optimizer."""
    weights = class_weights(config.training.class_weight, data.classes, data.train.y, data.task)
    network = build_network(config, data.sample_shape, seed, groups.model, data.encoder.embedded(),
                            None if weights is None else B.to_device(weights.astype(B.current().floatx)))
    check_run(config, network, data)
    if init_from is not None:
        try:
            network.load_state_dict(starting_weights(init_from))
        except MagmaError as exc:
            said = str(exc).removeprefix(f"{init_from}: ")
            raise MagmaError(f"--init-from {init_from}: {said}") from exc
    optimizer = build_optimizer(config, batch_schedule(config).steps(len(data.train.x), 1), network, len(data.train.x),
                                sweep)
    check_memory(config, network, len(optimizer.slots), len(data.train.x), batch_schedule(config).largest())
    return network, optimizer


def parallel_layout(config: Config, comm: Communicator, reporter: Reporter,
                    strategy: strategies.Strategy) -> ModelGroups:
    """The data- and model-parallel groups of `distributed.model_parallel` on this many ranks (and
    the strategy's warning when it needs more ranks than this run has)."""
    split = config.distributed.model_parallel
    if too_few := strategy.too_few_ranks(comm.size):
        reporter.warn(too_few)
    if split > 1 and comm.size == 1:
        reporter.warn(f"distributed.model_parallel: {split} needs {split} ranks or a multiple; this run has 1 "
                      "process, so the layers stay whole")
    return model_groups(comm, split)


def build_loss(config: Config) -> Loss:
    return LOSSES[config.loss.type](config.loss)


def batch_schedule(config: Config) -> BatchSchedule:
    training = config.training
    return BatchSchedule(training.batch_size, training.batch_schedule, training.gradient_accumulation_steps)


def build_network(config: Config, sample_shape: tuple[int, ...], seed: int | None = None, group: Any = None,
                  embedded: Sequence[Embedded] = (), class_weights: Any = None) -> Network:
    """`group`: the model-parallel ranks that split the dense layers (see `Network`); `embedded`: the
    encoder's embedded category columns (`ColumnEncoder.embedded`), a first stage before the layers;
    `class_weights`: per-class loss weights on the device (training.class_weight)."""
    first = [ColumnEmbeddings(embedded)] if embedded else []
    return Network(first + build_layers(config.model.layers), sample_shape, build_loss(config),
                   seed=config.run_seed if seed is None else seed, group=group, class_weights=class_weights)


def build_optimizer(config: Config, steps_per_epoch: int, network: Network | None = None,
                    rows: int | None = None, sweep: Callable[[int], float] | None = None) -> Optimizer:
    """The config's optimizer (its schedule's length defaults to training.epochs); given the network,
    it also learns the parameter tensors' shapes in the flat buffers (layer-wise rules, LARS and LAMB,
    take norms per tensor); given the training rows, a growing batch schedule's epochs (the
    learning-rate schedule is in epochs)."""
    scheduled = rows is not None and config.training.batch_schedule
    optimizer = OPTIMIZERS[config.optimizer.type](config.optimizer, steps_per_epoch, config.training.epochs,
                                                  partial(batch_schedule(config).epochs_done, rows) if scheduled else None,
                                                  sweep)
    if network is not None:
        optimizer.set_segments(network.parameter_shapes)
    return optimizer
