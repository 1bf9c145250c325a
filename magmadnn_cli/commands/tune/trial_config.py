"""What one trial of a search trains: the base config with the trial's overrides, on one process."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ...config.loading import apply_override, parse_override
from ...config.messages import format_problems, format_validation_error
from .search_space import space_size
from ...config.schema import Config, Distribution, DistributedConfig, SearchConfig
from ...distributed.strategies import config_problems, strategy_of
from ...errors import ConfigError

Overrides = dict[str, Any]


def trial_config(base: dict, overrides: Overrides) -> Config:
    """The base config (as plain data) with the overrides merged, validated again."""
    return Config.model_validate(_trial_data(base, overrides))


def _trial_data(base: dict, overrides: Overrides) -> dict:
    data = copy.deepcopy(base)
    data.pop("search", None)
    for key, value in overrides.items():
        apply_override(data, _path(key), copy.deepcopy(value), f"search.space.{key} = {value!r}")
    return data


def _path(key: str) -> tuple:
    return parse_override(f"{key}=0")[0]


def check_space(base: dict, search: SearchConfig) -> None:
    """Each searched key at each of its values (a range's bounds) makes a valid config: a typo in a
    key or a bad value is one error (per key) before any trial runs; then the space is sized (a search
    too large to run is refused before anything is allocated)."""
    problems = [problem for key, spec in search.space.items()
                if (problem := next(filter(None, (_problem(base, key, v) for v in _values(spec))), None))]
    if problems:
        raise ConfigError(f"invalid search space ({len(problems)} key(s)):\n" + "\n".join(problems))
    space_size(search)


def _problem(base: dict, key: str, value: Any) -> str | None:
    """What is wrong with the base config with `key` set to `value` (what the schema refuses, or
    its strategy does not support), located at that key; None if valid."""
    try:
        data = _trial_data(base, {key: value})
        problems = config_problems(Config.model_validate(data))
    except ConfigError as exc:
        return str(exc)
    except ValidationError as exc:
        return format_validation_error(exc, data, Path("config"), {}, _origin(key, value)).split("\n", 1)[1]
    if problems:
        return format_problems(problems, Path("config"), {}, _origin(key, value)).split("\n", 1)[1]
    return None


def _origin(key: str, value: Any) -> dict[tuple, str]:
    return {_path(key): f"search.space.{key} = {value!r}"}


def _values(spec: list[Any] | Distribution) -> list[Any]:
    if isinstance(spec, list):
        return spec
    return list(spec.uniform or spec.loguniform or spec.int_uniform)  # a range: its bounds


def one_process(config: Config) -> Config:
    """A trial's config: trials run one process each, so without the multi-rank layouts (whose
    one-process warnings would repeat for every trial; `split_layouts` says it once)."""
    return config.revised(distributed=DistributedConfig(sync_batchnorm=config.distributed.sync_batchnorm))


def split_layouts(config: Config) -> str | None:
    """The search's note when the config asks for a strategy whose steps differ from one process's
    (asynchronous SGD) or for split layers."""
    dist = config.distributed
    asked = [f"strategy {dist.strategy}"] * (not strategy_of(config).exact_on_any_rank_count) + \
        [f"model_parallel {dist.model_parallel}"] * (dist.model_parallel > 1)
    return (f"distributed {' and '.join(asked)}: each trial trains on one process (the ranks share out the "
            "trials), so they apply when best_config.yaml is trained") if asked else None
