"""The checks a run makes before its first step, where they need the data or the built network as
well as the config (the config's own are in `config/`): the output's width for the data's task, a
bounded output that cannot reach the targets, early stopping on a metric never measured, training's
memory, and a bias that a following batchnorm cancels. `builder.py` assembles; this module refuses."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config.activations import DECLARATIONS as ACTIVATION_DECLARATIONS
from ..config.rules import output_head
from ..config.schema import Config
from ..config.tasks import task_named
from ..core import backend as B
from ..data.prepare import Prepared
from ..data.targets import target_task
from ..errors import DataError, MagmaError
from ..nn.network import Network


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
    if task_named(config.loss.task).labels or not all(layer.keeps_range for layer in after):  # a batchnorm unbinds it
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


def check_memory(config: Config, network: Network, slots: int, rows: int, largest_batch: int) -> None:
    """Training's memory (its largest batch) fits, before the training buffers are allocated."""
    batch, scored = min(largest_batch, rows), min(config.training.eval_batch_size, rows)
    B.require_memory(network.training_bytes(batch, slots, scored),
                     f"training with batch {batch} and evaluation batch {scored} (training.batch_size, batch_schedule "
                     "and eval_batch_size; weights, gradients, optimizer state, activations)")


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
    task = task or config.loss.task
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
