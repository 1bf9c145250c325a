"""Config mistakes as one readable message each: the file and line (or the --set that gave the value),
the dotted path, what was expected and what was received, and the closest valid name."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from .schema import Config
from .yaml_source import Location, shorten


def where(path: Location, file: Path, lines: dict[Location, int], origins: dict[Location, str]) -> str:
    """A --set that replaced the path or a section above it; for a section's own check, the --set
    given inside it (with the section's line when the file has it); else the file line of the path's
    nearest part; for a problem of the whole config, the file plus every --set given."""
    for i in range(len(path), 0, -1):
        if path[:i] in origins:
            return origins[path[:i]]
    if not path and origins:
        return f"{file} with " + ", ".join(origins.values())
    below = [origin for key, origin in origins.items() if key[:len(path)] == path]  # a section's check
    if below:
        return (f"{file}:{lines[path]} with " if path in lines else "") + ", ".join(below)
    for i in range(len(path), -1, -1):
        if path[:i] in lines:
            return f"{file}:{lines[path[:i]]}"
    return str(file)


def _pick(annotation: Any, node: Any) -> Any:
    """The BaseModel member of an annotation (unwrapping Optional/Annotated/Union by `type` tag)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _pick(arg, node)
        if found is not None:
            if isinstance(node, dict) and "type" in found.model_fields and \
                    node.get("type") not in get_args(found.model_fields["type"].annotation):
                continue
            return found
    return None


def _model_at(data: Any, path: Location) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping at `path` (list items included)."""
    cls: Any = Config
    node = data
    for part in path:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
            cls = _pick(cls, node)
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return None
        annotation = cls.model_fields[part].annotation
        node = node.get(part) if isinstance(node, dict) else None
        cls = get_args(annotation)[0] if get_origin(annotation) is list else _pick(annotation, node)
    cls = _pick(cls, node) if not (isinstance(cls, type) and issubclass(cls, BaseModel)) else cls
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _listed(values: list[str]) -> str:
    """Choices as a message lists them: plain words as they are, quoted when any is punctuation or
    space (the thousands separators: '.', ',', ' ', "'", '_')."""
    plain = all(re.fullmatch(r"\w[\w.-]*", v) for v in values)
    return ", ".join(values if plain else map(repr, values))


# other tools' names for keys (Keras' `lr`, Lightning's `max_epochs`) that no spelling of ours is close to
OTHER_NAMES = {"lr": "learning_rate", "n_epochs": "epochs", "num_epochs": "epochs", "max_epochs": "epochs",
               "bs": "batch_size", "loss_function": "loss", "optim": "optimizer", "activation_function": "activation",
               "num_units": "units", "hidden_size": "units", "out_features": "units", "dropout": "rate"}


def _suggest(word: Any, choices: list[str]) -> str:
    close = [OTHER_NAMES[str(word)]] if OTHER_NAMES.get(str(word)) in choices else \
        difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f"\n  did you mean {close[0]!r}?" if close else ""


def _in_a_section(key: Any, model: Any) -> str:
    """For a key of no section at this level: the sections below that have it (a top-level
    `batch_size` belongs under training: an indentation slip)."""
    if model is None:
        return ""
    homes = [f"{name}.{key}" for name, field in model.model_fields.items()
             if isinstance(sub := _section_model(field.annotation), type) and key in sub.model_fields]
    under = f"{homes[0].split('.')[0]}:" if len(homes) == 1 else "its section"
    return f"\n  did you mean {' or '.join(homes)}? (indent it under {under})" if homes else ""


def _section_model(annotation: Any) -> Any:
    """The pydantic model a field holds (itself, or inside Optional)."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _describe(error: dict, data: Any, path: Location) -> tuple[str, str]:
    """(what is wrong, extra lines: expected / received / suggestion)."""
    kind, ctx = error["type"], error.get("ctx", {})
    received = error.get("input")
    if kind == "extra_forbidden":
        model = _model_at(data, path[:-1])
        allowed = sorted(model.model_fields) if model else []
        hint = f"\n  expected one of: {', '.join(allowed)}" if allowed else ""
        return f"unknown key {path[-1]!r}", hint + (_suggest(path[-1], allowed) or _in_a_section(path[-1], model))
    if kind == "union_tag_invalid":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        return (f"unknown type {ctx.get('tag')!r}",
                f"\n  expected one of: {', '.join(expected)}" + _suggest(ctx.get("tag"), expected))
    if kind == "union_tag_not_found":
        return "missing key 'type'", f"\n  expected a mapping with type: one of the {path[-1] if path else ''} kinds"
    if kind == "missing":
        return f"missing required key {path[-1]!r}" if path else "missing value", ""
    if kind == "literal_error":
        expected = [a or b for a, b in re.findall(r"'([^']*)'|\"([^\"]*)\"", str(ctx.get("expected", "")))]
        return "invalid value", (f"\n  expected one of: {_listed(expected)}\n  received: {shorten(repr(received))}"
                                 + _suggest(received, expected))
    if kind == "string_pattern_mismatch" and path and path[-1] == "name":
        return "not a safe name", (f"\n  expected letters, digits, _ . - (not starting with . or -), at most 100; "
                                   f"it names a folder\n  received: {shorten(repr(received))}")
    message = shorten(error["msg"].removeprefix("Value error, ").replace("Input should be", "expected"), 400)
    extra = "" if kind == "value_error" else f"\n  received: {shorten(repr(received))}"
    return message, extra


SHAPE_MISMATCHES = ("model_type", "dict_type", "model_attributes_type", "list_type")


def _other_member(error: dict[str, Any], path: Location, paths: list[Location]) -> bool:
    """A union member's complaint that the value has the wrong shape ('expected a mapping' for a
    string, 'invalid value' for a mapping) when another member reports on the same value."""
    siblings = sum(1 for q in paths if q[:len(path)] == path) > 1
    wrong_shape = error["type"] in SHAPE_MISMATCHES or (error["type"] == "literal_error"
                                                        and isinstance(error.get("input"), (dict, list)))
    return siblings and wrong_shape


def data_path(data: Any, loc: Location) -> Location:
    """pydantic's loc with union tags and wrapper names removed: the path in the user's data."""
    path: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            path.append(part)
            node = node[part]
        elif isinstance(part, str) and not (isinstance(node, dict) and part in node) and \
                ((isinstance(node, dict) and node.get("type") == part) or part in ("str", "function-after", "literal")
                 or "[" in part):
            continue  # a discriminator tag or a union member name
        else:
            path.append(part)
            node = None
    return tuple(path)


def format_problems(problems: list[tuple[Location, str]], file: Path, lines: dict[Location, int],
                    origins: dict[Location, str]) -> str:
    """Problems of a valid config (`load_config`'s checks), each located and worded as the schema's."""
    blocks = list(dict.fromkeys(f"{where(p, file, lines, origins)}: {'.'.join(map(str, p)) or '(top level)'}: {what}"
                                for p, what in problems))
    return _invalid(blocks)


def _invalid(blocks: list[str]) -> str:
    count = f"{len(blocks)} problem{'s' if len(blocks) > 1 else ''}"
    return f"invalid config ({count}):\n" + "\n".join(blocks)


def format_validation_error(exc: ValidationError, data: Any, file: Path, lines: dict[Location, int],
                            origins: dict[Location, str]) -> str:
    blocks: list[str] = []
    seen: set[str] = set()
    errors = exc.errors()
    paths = [data_path(data, e["loc"]) for e in errors]
    for error, path in zip(errors, paths):
        if _other_member(error, path, paths):
            continue  # a union's member that does not fit the value's shape, beside the one that does
        if error["type"] == "missing" and error["loc"] and error["loc"][-1] not in path:
            path = path + (error["loc"][-1],)
        what, extra = _describe(error, data, path)
        dotted = ".".join(map(str, path)) or "(top level)"
        block = f"{where(path, file, lines, origins)}: {dotted}: {what}{extra}"
        if block not in seen:
            seen.add(block)
            blocks.append(block)
    return _invalid(blocks)
