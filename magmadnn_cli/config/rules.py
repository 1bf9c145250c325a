"""Rules about a model as a whole, on plain layer descriptions (config specs and built layers alike:
both have `type`, `activation` and `name`): the output head, decided once for validation and for the
network; and the layers' names, under which weights are saved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .layers import LayerSpec, passes_through
from .losses import LossSpec
from .tasks import task_named


def layer_names(layers: Sequence[Any], prefix: str = "model.layers", parent: str = "") -> list[tuple[str, str]]:
    """(where, name) of every layer, blocks' inner layers included: the names the weights get."""
    found = []
    for index, layer in enumerate(layers):
        name = parent + (layer.name or f"{layer.type}_{index}")
        found.append((f"{prefix}.{index}", name))
        if "layers" in LayerSpec.declarations[layer.type].model_fields:  # a block
            found += layer_names(layer.layers, f"{prefix}.{index}.layers", name + ".")
    return found


@dataclass(frozen=True)
class Head:
    """The network's output: `index` of the layer whose activation produces it, that activation, and
    whether the loss fuses it (takes that layer's pre-activation, the logits, and applies the
    activation inside one stable node: softmax + cross-entropy, sigmoid + binary cross-entropy)."""
    index: int
    activation: str
    fused: bool


def output_head(layers: Sequence[Any], loss: str | None) -> Head:
    """Works on config layer specs and on built layers alike (both have `type` and `activation`)."""
    index, activation = len(layers) - 1, "linear"
    for i in range(len(layers) - 1, -1, -1):
        if not passes_through(layers[i]):
            index, activation = i, getattr(layers[i], "activation", "linear")
            break
    fused = loss is not None and LossSpec.declarations[loss].fuses == activation and index == len(layers) - 1
    return Head(index, activation, fused)


def head_problem(layers: Sequence[Any], loss: str) -> tuple[tuple[str | int, ...], str] | None:
    """Why this model's output cannot go with this loss, and the key where it is fixed (None when it can)."""
    head = output_head(layers, loss)
    where = f"model.layers.{head.index}.activation"
    required = LossSpec.declarations[loss].fuses
    if required and head.activation != required:
        return ("loss",), (f"{loss} needs a final {required} activation ({where}); received {head.activation!r}: "
                           f"set {where}: {required}")
    if required and not head.fused:
        after = head.index + 1
        return ("model", "layers", after), (
            f"the {required} of the output ({where}) must be on the last layer, but this {layers[after].type} "
            f"layer comes after it; move it before model.layers.{head.index}")
    if not task_named(LossSpec.declarations[loss].task).labels and head.activation in ("softmax", "log_softmax"):
        return ("loss",), (f"{loss} is a regression loss, but the final activation ({where}) is {head.activation!r}, "
                           "which gives class probabilities: for classes use loss: cross_entropy; for numbers make "
                           "it linear")
    return None
