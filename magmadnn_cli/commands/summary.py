"""`magmadnn summary`: one row per layer with output shape, parameters and FLOPs per sample."""

from __future__ import annotations

import math

from rich.table import Table

from ..core import backend as B
from ..training.builder import build_layers
from ..nn.layers import all_layers
from ..config.schema import Config
from ..data.tables import sample_shape_of


def summarize(config: Config) -> Table:
    B.select("cpu", config.precision)
    shape = sample_shape_of(config.data)
    table = Table(title=f"{config.name}: input {shape}")
    for column in ("layer", "type", "output shape", "parameters", "FLOPs/sample"):
        table.add_column(column, justify="left" if column in ("layer", "type") else "right")
    total_params = total_flops = 0
    for layer in build_layers(config):
        shape = layer.build(shape)
        params = sum(math.prod(s.shape) for inner in all_layers([layer]) for s in inner.specs)
        flops = layer.flops()
        total_params += params
        total_flops += flops
        table.add_row(layer.name, layer.type, str(shape), f"{params:,}", f"{flops:,}")
    table.add_section()
    table.add_row("total", "", "", f"{total_params:,}", f"{total_flops:,}")
    return table
