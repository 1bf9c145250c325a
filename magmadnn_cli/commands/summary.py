"""`magmadnn summary`: one row per layer with output shape, parameters and FLOPs per sample. Builds
the layers' shapes only: no weights are allocated and no device is selected."""

from __future__ import annotations

import math
from typing import Any

from ..config.schema import Config
from ..data.prepare import sample_shape_of
from ..nn.layers import all_layers
from ..reporting import grid
from ..training.builder import build_layers


def summarize(config: Config) -> Any:
    shape = sample_shape_of(config.data)
    title = f"{config.name}: input {shape}"
    rows = []
    total_params = total_flops = 0
    for layer in build_layers(config):
        shape = layer.build(shape)
        params = sum(math.prod(s.shape) for inner in all_layers([layer]) for s in inner.specs)
        flops = layer.flops()
        total_params += params
        total_flops += flops
        rows.append([layer.name, layer.type, str(shape), f"{params:,}", f"{flops:,}"])
    rows.append(["total", "", "", f"{total_params:,}", f"{total_flops:,}"])
    return grid(title, ["layer", "type", "output shape", "parameters", "FLOPs/sample"], rows, left=2)
