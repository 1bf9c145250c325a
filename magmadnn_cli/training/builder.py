"""From a validated config to runtime objects: each component's declaration goes to the
implementation registered for it."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..config.rules import output_head
from ..config.schema import Config
from ..errors import DataError
from ..nn.layers import build_layers
from ..nn.losses import LOSSES, Loss
from ..nn.network import Network
from ..nn.optimizers import OPTIMIZERS, Optimizer
from .batches import BatchSchedule


def task_of(config: Config) -> str:
    return config.loss.task


def build_loss(config: Config) -> Loss:
    return LOSSES[config.loss.type](config.loss)


def batch_schedule(config: Config) -> BatchSchedule:
    return BatchSchedule(config.training.batch_size, config.training.batch_schedule)


def build_network(config: Config, sample_shape: tuple[int, ...], seed: int | None = None, group: Any = None) -> Network:
    """`group`: the model-parallel ranks that split the dense layers (see `Network`)."""
    return Network(build_layers(config.model.layers), sample_shape, build_loss(config),
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
    index = max((i for i, layer in enumerate(layers) if layer.width_field), default=head.index)
    field = layers[index].width_field
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
