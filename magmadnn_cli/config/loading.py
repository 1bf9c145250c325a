"""Reading a config: its YAML (`yaml_source`), `--set` overrides, data paths resolved and checked,
validation, and the strategy's checks; mistakes reported through `messages`."""

from __future__ import annotations

import os
import re
import secrets
import shlex
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml
from pydantic import ValidationError

from .messages import format_problems, format_validation_error, where
from .schema import Config
from .yaml_source import HugeNumber, Location, parse_yaml, read_yaml, shorten
from ..errors import ConfigError

Check = Callable[[Config], list[tuple[Location, str]]]  # a valid config -> (path, problem) of what it cannot run

PATH_FIELDS = (("data", "train"), ("data", "validation"), ("data", "test"))


def parse_override(text: str) -> tuple[Location, Any]:
    """`model.layers.0.units=64` -> (("model", "layers", 0, "units"), 64); values are YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {shorten(text)!r}: expected dotted.key=value, e.g. --set training.epochs=20")
    if raw.strip() in ("", "-"):  # `data.train=-`: stdin (in YAML a lone `-` would be a list)
        value: Any = raw.strip()
    else:
        try:
            value = parse_yaml(raw, f"--set {shorten(text)}", labels="label_map" in key.split("."))[0]
        except ConfigError as exc:  # `,` `&` `*` `!` `|` `>` `%` `@` begin YAML syntax
            if raw.strip().startswith(("[", "{")) or isinstance(exc.__cause__, HugeNumber):  # not text meant
                raise
            quoted = shlex.quote(f"{key}={yaml.safe_dump(raw.strip(), default_style=chr(34)).strip()}")
            raise ConfigError(f"{exc}\n  the value is read as YAML; to mean the text {raw.strip()!r}, quote it: "
                              f"--set {quoted}") from None
    path = tuple(int(p) if p.isdigit() else p for p in key.strip().split("."))
    return path, value


SHORTHANDS = (("loss",), ("optimizer",), ("data", "columns", None))  # `optimizer: adam` is {type: adam}


def _expanded(node: Any, path: Location) -> Any:
    """A string shorthand a --set reaches inside (`optimizer: adam` and optimizer.learning_rate=...)
    as the mapping it stands for, {type: adam}; any other value as it is."""
    shorthand = any(len(s) == len(path) and all(a is None or a == b for a, b in zip(s, path)) for s in SHORTHANDS)
    return {"type": node} if shorthand and isinstance(node, str) else node


def apply_override(data: dict, path: Location, value: Any, origin: str) -> None:
    node: Any = data
    for i, part in enumerate(path[:-1]):
        where = ".".join(map(str, path[:i + 1]))
        if isinstance(node, dict) and isinstance(node.get(part), str):
            node[part] = _expanded(node[part], path[:i + 1])
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise ConfigError(f"{origin}: {where}: no list item {part} (the list has {len(node)})")
            node = node[part]
        elif isinstance(node, dict):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        else:
            raise ConfigError(f"{origin}: {where}: cannot set a key inside a {type(node).__name__}")
    last = path[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or last > len(node):
            raise ConfigError(f"{origin}: no list item {last} (the list has {len(node)})")
        node[last:last + 1] = [value]
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"{origin}: cannot set {last!r} inside a {type(node).__name__}")


def load_config(path: Path | str, overrides: list[str] | tuple[str, ...] = (), draw_seed: bool = True,
                checks: Sequence[Check] = ()) -> Config:
    """Read, override, resolve paths, validate, then run `checks` (the runtime's, which the config
    cannot import: e.g. what the distributed strategy supports), their problems located like the
    schema's; a seed is drawn if the config has none (and `draw_seed`)."""
    path = Path(path)
    data, lines = read_yaml(path)
    origins: dict[Location, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        apply_override(data, key, value, f"--set {text}")
        origins[key] = f"--set {text}"
    data.setdefault("name", re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem).lstrip(".-")[:100] or "run")
    written = _resolve_paths(data, path.parent, origins)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, data, path, lines, origins)) from exc
    problems = [problem for check in checks for problem in check(config)]
    if problems:
        raise ConfigError(format_problems(problems, path, lines, origins))
    for key, text in written.items():
        _check_data_file(key, text, Path(data[key[0]][key[1]]), where(key, path, lines, origins),
                         None if key in origins else path.resolve().parent)
    config = seeded(config) if draw_seed else config
    config._source = (path, lines, origins)
    return config


def seeded(config: Config, agree: Callable[[int], int] = lambda seed: seed, recorded: int | None = None) -> Config:
    """The config with a seed: its own; else `recorded` (a resumed run's); else one drawn here (the only
    place a seed is drawn), made the same on every rank by `agree` (a broadcast from rank 0)."""
    if config.seed is not None:
        return config
    seed = recorded if recorded is not None else agree(secrets.randbelow(2**31))
    return config.revised(seed=seed)


def _resolve_paths(data: dict, base: Path, origins: dict[Location, str]) -> dict[Location, str]:
    """Data paths, `~` and `$VARS` expanded, made absolute: those from the file relative to the file,
    those from --set relative to the working directory. Absolute, so the config a run writes trains
    again from any directory. Returns each resolved path's text as written."""
    written = {}
    for key in PATH_FIELDS:
        section = data.get(key[0])
        if isinstance(section, dict) and isinstance(section.get(key[1]), str) and section[key[1]] != "-":
            written[key] = section[key[1]]
            p = Path(os.path.expandvars(section[key[1]])).expanduser()
            start = Path.cwd() if key in origins else base
            section[key[1]] = os.path.abspath(p if p.is_absolute() else start / p)
    return written


def _check_data_file(key: Location, text: str, resolved: Path, where: str, config_dir: Path | None) -> None:
    """A data path that names nothing: where it was given, the rule it was resolved by, and the file
    the user probably meant when the same text names one from the working directory."""
    if resolved.exists():
        return
    dotted = ".".join(map(str, key))
    if config_dir is None:
        raise ConfigError(f"{where}: {dotted}: {text} not found ({resolved}; a path given with --set is relative "
                          "to the working directory)")
    message = (f"{where}: {dotted}: {text} not found: {resolved} (paths in a config file are relative to the "
               f"config file's folder, {config_dir})")
    here = Path(os.path.expandvars(text)).expanduser().absolute()
    if not Path(text).is_absolute() and here.exists():
        message += (f". {here} exists in the working directory: write {dotted}: "
                    f"{os.path.relpath(here, config_dir)} (relative to the config file) or the absolute path")
    raise ConfigError(message)


# -- error messages ------------------------------------------------------------------------------
