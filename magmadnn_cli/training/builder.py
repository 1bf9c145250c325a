"""From a validated config to the runtime objects of a run, and every check a run makes before its
first step: each component's declaration goes to the implementation registered for it; `build_run`
assembles data, network, optimizer, the strategy's wrapper and the trainer (the commands orchestrate)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..config.rules import output_head
from ..config.activations import DECLARATIONS as ACTIVATION_DECLARATIONS
from ..config.schema import Config
from ..config.tasks import task_named
from ..core import backend as B
from ..data.augment import augment
from ..data.prepare import Prepared, class_weights, prepare
from ..data.columns import Embedded
from ..data.stream_prepare import prepare_streamed, streaming
from ..data.targets import target_task
from ..distributed import Communicator, strategies
from ..distributed.async_sgd import AsyncParallel
from ..distributed.comm import on_every_rank
from ..distributed.model_parallel import ModelGroups, model_groups
from ..errors import DataError, MagmaError
from ..nn.embedding import ColumnEmbeddings
from ..nn.layers import build_layers
from ..nn.losses import LOSSES, Loss
from ..nn.network import Network
from ..nn.optimizers import OPTIMIZERS, Optimizer
from ..reporting import Reporter
from .async_trainer import AsyncTrainer
from .batches import BatchSchedule
from .checkpoint import Saver, starting_weights
from .convolutions import choose_convolutions
from .early_stopping import EarlyStopper
from .stream_trainer import StreamTrainer
from .trainer import History, Plan, Trainer


@dataclass
class Run:
    """Everything a training needs, built and checked before its first step."""
    config: Config
    comm: Communicator
    backend: B.Backend
    data: Prepared
    network: Network
    trainer: Trainer
    stopper: EarlyStopper | None
    saver: Saver | None

    @property
    def task(self) -> str:
        return self.trainer.task

    def fit(self, prune: Any = None) -> History:
        """Choose the convolutions' algorithms, then train to `training.epochs` (from where a resumed
        checkpoint left off)."""
        choose_convolutions(self.trainer, self.data.train.x)
        return self.trainer.fit(self.data.train, self.data.validation, self.config.training.epochs, self.stopper,
                                prune=prune)


def select_backend(config: Config, comm: Communicator) -> B.Backend:
    """The backend the config asks for, chosen alike on every rank (GPU ranks by node-local rank);
    `backend.using` makes it the run's."""
    backend = on_every_rank(comm, lambda: B.select(config.device, config.precision, config.memory))
    if backend.device == "gpu":
        with B.using(backend):
            B.use_gpu_device(comm.local_rank)
    return backend


def build_run(config: Config, comm: Communicator, reporter: Reporter, checkpoints: Path | None = None,
              init_from: Path | None = None, fold: tuple[int, int] | None = None) -> Run:
    """Read and split the data (fold k of K: its test split), build the network, optimizer, the
    strategy's wrapper and the trainer on the current backend, and make every check a run makes
    before its first step (`validate` runs exactly this)."""
    seed = config.seed if config.seed is not None else 0
    strategy = strategies.checked_strategy(config)
    streamed = streaming(config, comm.size, fold)  # data.stream: epochs read from the file (issue 48)
    data = prepared_data(comm, lambda: prepare_streamed(config.data, task_of(config), seed) if streamed else
                         prepare(config.data, task_of(config), seed, fold))
    if data.settled:  # what the data file said (its number style): saved, so new files are read alike
        config = config.model_copy(update={"data": config.data.model_copy(update=data.settled)})
    groups = parallel_layout(config, comm, reporter, strategy)
    network, optimizer = on_every_rank(comm, lambda: network_and_optimizer(config, data, seed, groups, init_from))
    parallel = strategy.wrapper(network, optimizer, comm, groups, config.distributed)
    policy = config.training.checkpoint if checkpoints is not None else None
    saver = Saver(checkpoints, policy, config, data.train, comm) if checkpoints is not None and policy else None
    loop = StreamTrainer if streamed else AsyncTrainer if isinstance(parallel, AsyncParallel) else Trainer
    trainer = loop(parallel, plan(config, saver, data.task), reporter, saver)
    es = config.training.early_stopping
    stopper = EarlyStopper(es.monitor, es.patience, es.min_delta, es.restore_best) if es else None
    return Run(config, comm, B.current(), data, network, trainer, stopper, saver)


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
    return Plan(task, batch_schedule(config), config.seed or 0, training.shuffle, training.eval_batch_size,
                (lambda xb, rows, key: augment(xb, rows, key, aug.crop_padding, aug.horizontal_flip)) if aug else None,
                stop_on_signal=bool(saver is not None and policy and policy.on_signal),
                cuda_graph=training.cuda_graph == "auto")


def network_and_optimizer(config: Config, data: Prepared, seed: int, groups: ModelGroups,
                          init_from: Path | None) -> tuple[Network, Optimizer]:
    """The network (checked against the data, --init-from's weights loaded) and its optimizer."""
    network = build_network(config, data.sample_shape, seed, groups.model, data.encoder.embedded())
    check_run(config, network, data)
    weights = class_weights(config.training.class_weight, data.classes, data.train.y, data.task)
    if weights is not None:
        network.class_weights = B.to_device(weights.astype(B.current().floatx))
    if init_from is not None:
        try:
            network.load_state_dict(starting_weights(init_from))
        except MagmaError as exc:
            said = str(exc).removeprefix(f"{init_from}: ")
            raise MagmaError(f"--init-from {init_from}: {said}") from exc
    optimizer = build_optimizer(config, batch_schedule(config).steps(len(data.train.x), 1), network, len(data.train.x))
    check_memory(config, network, len(optimizer.slots), len(data.train.x))
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


def check_run(config: Config, network: Network, data: Prepared) -> None:
    """The checks that need the data as well as the config."""
    targets = int(data.train.y.shape[1]) if data.train.y.ndim == 2 else 1
    check_output_width(config, network, data.classes, data.source, targets, data.task)
    if config.training.augment is not None and len(data.sample_shape) != 3:
        raise MagmaError(f"training.augment is for (channels, height, width) images; the samples have shape "
                         f"{data.sample_shape} (set data.shape)")
    unreachable = unreachable_targets(config, data)
    if unreachable:
        raise DataError(unreachable)
    if problem := _unmeasured_monitor(config, data):
        raise MagmaError(problem)


def _unmeasured_monitor(config: Config, data: Prepared) -> str | None:
    """Early stopping on a metric the run never reports (it would never fire), at its key."""
    es = config.training.early_stopping
    if es is None:
        return None
    key = f"{config.where('training', 'early_stopping', 'monitor') or ''}: training.early_stopping.monitor".lstrip(": ")
    if "accuracy" in es.monitor and not task_named(config.loss.task).labels:
        return (f"{key}: {es.monitor} is measured for a classification loss; loss {config.loss.type} reports "
                "val_loss and loss (monitor: val_loss)")
    if es.monitor.startswith("val_") and data.validation is None:
        return f"{key}: {es.monitor} needs validation data (data.validation_split > 0 or data.validation)"
    return None


UNREACHABLE_SHARE = 0.01  # a few outliers out of reach are the data's; more are the head's


def unreachable_targets(config: Config, data: Prepared) -> str | None:
    """A regression output bounded by its activation (sigmoid, tanh, relu, elu, gelu) that more than 1%
    of the training targets, as scaled, lie outside of: the model could never fit them (a sigmoid on
    standardized targets reaches only [mean, mean + 1 sd])."""
    head = output_head(config.model.layers, config.loss.type)
    after = config.model.layers[head.index + 1:]
    if task_named(task_of(config)).labels or not all(layer.keeps_range for layer in after):  # a batchnorm unbinds it
        return None
    low, high = ACTIVATION_DECLARATIONS[head.activation].output_range(getattr(config.model.layers[head.index], "alpha", None))
    y = data.train.y
    share = float(np.mean((y < low) | (y > high))) if y.size else 0.0
    if share <= UNREACHABLE_SHARE:
        return None
    key = ("model", "layers", head.index, "activation")
    place = config.where(*key) or config.where(*key[:3])
    scaled = f"standardized (data.target_normalize: {config.data.target_normalize})" if data.targets.active else \
        "as they are (data.target_normalize: none)"
    raw = y * data.targets.spread.astype(np.float64) + data.targets.shift if data.targets.active else y
    slack = 1e-6 * float(np.max(data.targets.spread)) if data.targets.active else 0.0  # float32 rounding of 0 and 1
    keep = data.targets.active and bool(((raw >= low - slack) & (raw <= high + slack)).all())
    fix = (f"your targets lie in [{low:g}, {high:g}]: keep the {head.activation} with data.target_normalize: none, "
           "or make the output linear" if keep else "make the output linear (activation: linear, the usual "
           "regression head)")
    return (f"{place + ': ' if place else ''}model.layers.{head.index}.activation: {head.activation} outputs lie in "
            f"[{low:g}, {high:g}], but {share:.0%} of the training targets, {scaled}, lie outside it, so the model "
            f"cannot fit them: {fix}")


def check_memory(config: Config, network: Network, slots: int, rows: int) -> None:
    """Training's memory (its largest batch) fits, before the training buffers are allocated."""
    batch, scored = min(batch_schedule(config).largest(), rows), min(config.training.eval_batch_size, rows)
    B.require_memory(network.training_bytes(batch, slots, scored),
                     f"training with batch {batch} and evaluation batch {scored} (training.batch_size, batch_schedule "
                     "and eval_batch_size; weights, gradients, optimizer state, activations)")


def task_of(config: Config) -> str:
    """The loss's task (label-set targets make a binary one multi-label: `Prepared.task`)."""
    return config.loss.task


def build_loss(config: Config) -> Loss:
    return LOSSES[config.loss.type](config.loss)


def batch_schedule(config: Config) -> BatchSchedule:
    training = config.training
    return BatchSchedule(training.batch_size, training.batch_schedule, training.gradient_accumulation_steps)


def build_network(config: Config, sample_shape: tuple[int, ...], seed: int | None = None, group: Any = None,
                  embedded: Sequence[Embedded] = ()) -> Network:
    """`group`: the model-parallel ranks that split the dense layers (see `Network`); `embedded`: the
    encoder's embedded category columns (`ColumnEncoder.embedded`), a first stage before the layers."""
    first = [ColumnEmbeddings(embedded)] if embedded else []
    return Network(first + build_layers(config.model.layers), sample_shape, build_loss(config),
                   seed=config.seed if seed is None else seed, group=group)


def build_optimizer(config: Config, steps_per_epoch: int, network: Network | None = None,
                    rows: int | None = None) -> Optimizer:
    """The config's optimizer (its schedule's length defaults to training.epochs); given the network,
    it also learns the parameter tensors' shapes in the flat buffers (layer-wise rules, LARS and LAMB,
    take norms per tensor); given the training rows, a growing batch schedule's epochs (the
    learning-rate schedule is in epochs)."""
    optimizer = OPTIMIZERS[config.optimizer.type](config.optimizer, steps_per_epoch, config.training.epochs)
    if network is not None:
        optimizer.set_segments(network.parameter_shapes)
    if rows is not None and config.training.batch_schedule:
        optimizer.epoch_of_step = partial(batch_schedule(config).epochs_done, rows)
    return optimizer


def check_output_width(config: Config, network: Network, classes: list[Any], source: str, targets: int = 1,
                       task: str | None = None) -> None:
    units = network.output_shape[-1] if network.output_shape else 1
    problem = output_width_problem(config, units, classes, source, targets, task)
    if problem:
        raise DataError(problem)


def output_width_problem(config: Config, units: int, classes: list[Any], source: str, targets: int = 1,
                         task: str | None = None) -> str | None:
    """Why the output's `units` do not fit the data (None when they do): one unit per class
    (cross-entropy), one unit (binary), one per label (multi-label) or one per target column
    (regression); `task`: the loss's as the data make it (default: the loss's own)."""
    task = task or task_of(config)
    rule = target_task(task)
    expected = rule.width(classes, targets)
    if units == expected:
        return None
    head = output_head(config.model.layers, config.loss.type)
    layers = config.model.layers
    index = max((i for i, layer in enumerate(layers) if layer.width_field), default=head.index)
    field = layers[index].width_field
    where = f"model.layers.{index}.{field}" if field else f"model.layers.{index} ({layers[index].type})"
    place = config.where("model", "layers", index, *([field] if field else []))
    return (f"{place + ': ' if place else ''}{where}: the output layer has {units} unit{'s' * (units != 1)}; expected {expected} "
            + rule.width_reason(classes, source, targets))


def bias_warnings(layers: list[Any], prefix: str = "model.layers") -> list[str]:
    """A bias right before batchnorm is cancelled by it: its gradient is zero up to rounding, which
    adaptive optimizers (Adam, RMSprop) scale up into full-size random steps."""
    notes = []
    for i, layer in enumerate(layers):
        if getattr(layer, "layers", None):
            notes += bias_warnings(layer.layers, f"{prefix}.{i}.layers")
        following = layers[i + 1] if i + 1 < len(layers) else None
        if (following is not None and following.cancels_bias and getattr(layer, "use_bias", False)
                and layer.activation == "linear"):
            notes.append(f"{prefix}.{i}.use_bias: this bias feeds the batchnorm {prefix}.{i + 1}, which subtracts it "
                         "again, so it only learns rounding noise (and runs on different rank counts drift apart); "
                         "set use_bias: false")
    return notes


def pin_conv_algorithms(config: Config, network: Network) -> Config:
    """The config with every `conv_algorithm: auto` or `fastest` layer set to the algorithm it ran:
    `fastest` times the machine, so a written config repeats its run only with the choices pinned
    (and a pinned auto layer keeps its algorithm if a later version changes the rule)."""
    ran = iter(network.conv_algorithms().values())  # the network's convolutions, in the specs' order

    def pinned(specs: list[Any]) -> list[Any]:
        out = []
        for spec in specs:
            if "conv_algorithm" in type(spec).model_fields:
                algorithm = next(ran)
                spec = spec.model_copy(update={"conv_algorithm": algorithm}) if spec.conv_algorithm in ("auto", "fastest") \
                    else spec
            elif getattr(spec, "layers", None):
                spec = spec.model_copy(update={"layers": pinned(spec.layers)})
            out.append(spec)
        return out
    return config.model_copy(update={"model": config.model.model_copy(update={"layers": pinned(config.model.layers)})})
