"""What one trial of a search trains: the base config with the trial's overrides, on one process."""

from __future__ import annotations

import copy
from typing import Any

from ..config.loading import apply_override, parse_override
from ..config.schema import Config, DistributedConfig

Overrides = dict[str, Any]


def trial_config(base: dict, overrides: Overrides) -> Config:
    """The base config (as plain data) with the overrides merged, validated again."""
    data = copy.deepcopy(base)
    data.pop("search", None)
    for key, value in overrides.items():
        path, _ = parse_override(f"{key}=0")
        apply_override(data, path, copy.deepcopy(value), f"search.space.{key}")
    return Config.model_validate(data)


def one_process(config: Config) -> Config:
    """A trial's config: trials run one process each, so without the multi-rank layouts (whose
    one-process warnings would repeat for every trial; `split_layouts` says it once)."""
    return config.model_copy(update={"distributed": DistributedConfig(sync_batchnorm=config.distributed.sync_batchnorm)})


def split_layouts(config: Config) -> str | None:
    """The search's note when the config asks for asynchronous SGD or split layers."""
    dist = config.distributed
    asked = [f"strategy {dist.strategy}"] * (dist.strategy == "async") + \
        [f"model_parallel {dist.model_parallel}"] * (dist.model_parallel > 1)
    return (f"distributed {' and '.join(asked)}: each trial trains on one process (the ranks share out the "
            "trials), so they apply when best_config.yaml is trained") if asked else None
