"""`magmadnn summary`: one row per layer with output shape, parameters and FLOPs per sample, for
the input `train` would give the network (columns encoded on the same split's training rows), or
of a saved model (its file alone: the input it was trained on). Builds the layers' shapes only: no
weights are allocated and no device is selected."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any

from ..config.schema import Config
from ..errors import ConfigError
from ..data.columns import ColumnEncoder
from ..data.image_folder import looking_only
from ..data.prepare import SampleInputs, sample_inputs
from ..core.graph.convolution import candidates, rule
from ..nn.embedding import ColumnEmbeddings
from ..nn.layers import Conv2D, all_layers, build_layers
from ..reporting import grid
from ..training.run_checks import output_width_problem


def is_saved_model(path: Path) -> bool:
    """Whether `path` names a saved model (a run folder, or a zip/.npz file) rather than a config."""
    return path.is_dir() or (path.is_file() and zipfile.is_zipfile(path))


def summarize_saved(path: Path, overrides: list[str] | None) -> tuple[Any, None]:
    """The summary of a saved model: its config as trained, on the input it was trained on (as
    `summarize`: its output fits, as trained)."""
    from ..inference import Predictor  # only for a model
    from ..training.run_folder import RunFolder
    if overrides:
        raise ConfigError(f"--set changes a config; {path} is a saved model, summarized as it was trained "
                          "(summarize its config.yaml to try changes)")
    saved = Predictor(RunFolder.model_file(path), "cpu").saved  # checked as predict checks it
    return summarize(saved.config, SampleInputs(tuple(saved.sample_shape), saved.encoder))


def summarize(config: Config, inputs: SampleInputs | None = None) -> tuple[Any, str | None]:
    """The table for a config (`inputs`: what the network takes, where known; else read from its
    data), its caption listing the inputs wider than a number column and conv algorithms; and why
    the output does not fit the data's classes or targets (None: it does, or they are not known)."""
    known = inputs is not None
    with looking_only():  # an image folder: listed, the first header read, nothing decoded
        inputs = inputs or sample_inputs(config.data, config.loss.task, config.run_seed)
    shape, encoder = inputs.shape, inputs.encoder
    title = f"{config.name}: each sample's input is {_values(shape)}"
    if not known and config.seed is None and not (config.data.shape or config.data.synthetic):
        title += " (seed unset: each run splits the rows afresh, so a category column's width may differ)"
    rows = []
    total_params = total_flops = 0
    embedded = encoder.embedded() if encoder is not None else []
    layers = [ColumnEmbeddings(embedded)] * bool(embedded) + build_layers(config.model.layers)
    for layer in layers:
        shape = layer.build(shape)
        params = sum(math.prod(s.shape) for inner in all_layers([layer]) for s in inner.specs)
        flops = layer.flops()
        total_params += params
        total_flops += flops
        rows.append([layer.name, layer.type, str(shape), f"{params:,}", f"{flops:,}", _short(layer)])
    rows.append(["total", "", "", f"{total_params:,}", f"{total_flops:,}", ""])
    header = ["layer", "type", "output shape", "parameters", "FLOPs/sample", "conv"]
    convs = [f"{layer.name}: {_algorithm(layer)}" for layer in all_layers(layers) if isinstance(layer, Conv2D)]
    caption = "\n".join(c for c in (_inputs_caption(encoder), "conv algorithm: " + "; ".join(convs) if convs else "")
                         if c) or None
    problem = None if inputs.classes is None else \
        output_width_problem(config, shape[-1] if shape else 1, inputs.classes, inputs.source, inputs.targets,
                             inputs.task)
    if not convs:
        return grid(title, header[:-1], [row[:-1] for row in rows], left=2, caption=caption), problem
    return grid(title, header, rows, left=2, caption=caption), problem


def _inputs_caption(encoder: ColumnEncoder | None, shown: int = 12) -> str:
    """'inputs: color 3 (category), listed 5 (date); 4 number columns': where the input's width
    comes from, when some column encodes into more (or other) than one number."""
    columns = encoder.inputs() if encoder is not None else []
    wide = [c for c in columns if c.form.declaration.cell != "number" or c.width != 1]
    if not wide:
        return ""
    plain = len(columns) - len(wide)
    listed = ", ".join(f"{c.name} {c.width} ({c.kind}{f' code, embedded in {c.embedding}' * bool(c.embedding)}"
                       f"{' + missing indicator' if c.indicator else ''})"
                       for c in wide[:shown]) + (f", ... ({len(wide) - shown} more)" if len(wide) > shown else "")
    return f"inputs: {listed}" + (f"; {plain} number column{'s' * (plain != 1)}, 1 each" if plain else "")


def _values(shape: tuple[int, ...]) -> str:
    """'5 numbers', or an image's '(1, 28, 28) numbers': never a bare (210,) a reader takes for rows."""
    return f"{shape[0]:,} number{'s' * (shape[0] != 1)}" if len(shape) == 1 else f"{shape} numbers"


def _short(layer: Any) -> str:
    return layer.algorithm if isinstance(layer, Conv2D) else ""


def _algorithm(layer: Conv2D) -> str:
    """What runs a convolution layer: the forced algorithm (or gemm, where it cannot run the layer),
    for auto the fixed rule's choice, for fastest the candidates that training times on its first batch."""
    options = candidates(layer.geometry())
    if layer.algorithm == "auto":
        return f"{rule(layer.geometry(), layer.input_shape[0], layer.filters)} (auto: the fixed rule)"
    if layer.algorithm == "fastest":
        return f"the fastest of {'/'.join(options)}, timed when training starts" if len(options) > 1 else "gemm"
    return layer.algorithm if layer.algorithm in options else f"gemm ({layer.algorithm} cannot run this layer)"
