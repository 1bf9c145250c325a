"""From a validated config to runtime objects, through one registry per kind."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..nn import schedules
from ..config.rules import output_head
from ..config.schema import Config
from ..errors import DataError
from ..nn.layers import LAYERS, Layer
from ..nn.losses import LOSSES, Loss
from ..nn.network import Network
from ..nn.optimizers import OPTIMIZERS, Optimizer
from .batches import BatchSchedule

TASKS = {"cross_entropy": "classification", "binary_cross_entropy": "binary", "mse": "regression", "mae": "regression"}


def task_of(config: Config) -> str:
    return TASKS[config.loss.type]


def build_layers(config: Config) -> list[Layer]:
    return _layers(config.model.layers)


def _layers(specs: list[Any]) -> list[Layer]:
    layers = []
    for index, spec in enumerate(specs):
        args: dict[str, Any] = spec.model_dump(exclude={"type", "name", "alpha", "layers"}, exclude_none=True)
        if spec.type == "residual":
            args["layers"] = _layers(spec.layers)
        alpha = getattr(spec, "alpha", None)
        if alpha is not None:
            args["alpha"] = alpha
        for key in ("kernel_initializer", "bias_initializer"):
            if key in args and isinstance(args[key], dict):
                args[key] = dict(args[key])
        if spec.type == "input":
            args["shape"] = tuple(args["shape"])
        layers.append(LAYERS[spec.type](name=spec.name or f"{spec.type}_{index}", **args))
    return layers


def build_loss(config: Config) -> Loss:
    return LOSSES[config.loss.type]()


def batch_schedule(config: Config) -> BatchSchedule:
    return BatchSchedule(config.training.batch_size, config.training.batch_schedule)


def build_network(config: Config, sample_shape: tuple[int, ...], seed: int | None = None, group: Any = None) -> Network:
    """`group`: the model-parallel ranks that split the dense layers (see `Network`)."""
    return Network(build_layers(config), sample_shape, build_loss(config), seed=config.seed if seed is None else seed,
                   group=group)


def build_optimizer(config: Config, steps_per_epoch: int, network: Network | None = None,
                    rows: int | None = None) -> Optimizer:
    """The config's optimizer and schedule; given the network, it also learns the parameter tensors'
    shapes in the flat buffers (layer-wise rules, LARS and LAMB, take norms per tensor); given the
    training rows, a growing batch schedule's epochs (the learning-rate schedule is in epochs)."""
    spec = config.optimizer
    args = spec.model_dump(exclude={"type", "schedule"})
    lr = spec.learning_rate
    schedule = schedules.constant(lr)
    if spec.schedule is not None:
        s = spec.schedule.model_dump(exclude={"type", "warmup_epochs"})
        if spec.schedule.type == "cosine" and s.get("epochs") is None:
            s["epochs"] = max(1, config.training.epochs)
        schedule = schedules.SCHEDULES[spec.schedule.type](lr, **s)
        if spec.schedule.warmup_epochs:
            schedule = schedules.warmup(schedule, spec.schedule.warmup_epochs)
    optimizer = OPTIMIZERS[spec.type](schedule=schedule, steps_per_epoch=steps_per_epoch, **args)
    if network is not None:
        optimizer.set_segments(network.parameter_shapes)
    if rows is not None and config.training.batch_schedule:
        optimizer.epoch_of_step = partial(batch_schedule(config).epochs_done, rows)
    return optimizer


def check_output_width(config: Config, network: Network, classes: list[Any], source: str, targets: int = 1) -> None:
    """The output must have one unit per class (cross-entropy), one unit (binary) or one per target
    column (regression)."""
    units = network.output_shape[-1] if network.output_shape else 1
    task = task_of(config)
    expected = {"classification": len(classes), "binary": 1}.get(task, targets)
    if units == expected:
        return
    head = output_head(config.model.layers, config.loss.type)
    layers = config.model.layers
    index = max((i for i, layer in enumerate(layers) if layer.type == "dense"), default=head.index)
    field = "units" if layers[index].type == "dense" else "filters" if layers[index].type == "conv2d" else None
    where = f"model.layers.{index}.{field}" if field else f"model.layers.{index} ({layers[index].type})"
    why = {"classification": f"the {len(classes)} classes in {source}: {', '.join(map(str, classes[:12]))}",
           "binary": f"binary_cross_entropy: {', '.join(map(str, classes[:12]))}"}.get(
        task, f"{source} has {targets} regression target column(s)")
    raise DataError(f"{where}: the output layer has {units} units; expected {expected} ({why})")


def bias_warnings(layers: list[Any], prefix: str = "model.layers") -> list[str]:
    """A bias right before batchnorm is cancelled by it: its gradient is zero up to rounding, which
    adaptive optimizers (Adam, RMSprop) scale up into full-size random steps."""
    notes = []
    for i, layer in enumerate(layers):
        if layer.type == "residual":
            notes += bias_warnings(layer.layers, f"{prefix}.{i}.layers")
        following = layers[i + 1] if i + 1 < len(layers) else None
        if (following is not None and following.type == "batchnorm" and layer.type in ("dense", "conv2d")
                and layer.use_bias and layer.activation == "linear"):
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
            if spec.type == "conv2d":
                algorithm = next(ran)
                spec = spec.model_copy(update={"conv_algorithm": algorithm}) if spec.conv_algorithm in ("auto", "fastest") \
                    else spec
            elif getattr(spec, "layers", None):
                spec = spec.model_copy(update={"layers": pinned(spec.layers)})
            out.append(spec)
        return out
    return config.model_copy(update={"model": config.model.model_copy(update={"layers": pinned(config.model.layers)})})
