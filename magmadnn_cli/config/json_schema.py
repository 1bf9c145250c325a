"""The JSON Schema of a config *file* (`magmadnn schema`): the pydantic model's, plus what loading
accepts before validation."""

from __future__ import annotations

from typing import Any

from .schema import Config, Loss, Optimizer, union_tags


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config *file*: the model's, plus what loading accepts before validation
    (`loss: cross_entropy` / `optimizer: sgd` shorthands, `training.checkpoint: true|false`, and no
    `name`: it defaults to the file's name)."""
    schema = Config.model_json_schema()
    properties = schema["properties"]
    for key, union in (("loss", Loss), ("optimizer", Optimizer)):
        properties[key] = {"anyOf": [properties[key], {"enum": sorted(union_tags(union))}],
                           "description": f"a {key} section, or just its type"}
    schema["required"] = [k for k in schema.get("required", []) if k != "name"]
    checkpoint = schema["$defs"]["TrainingConfig"]["properties"]["checkpoint"]
    checkpoint["anyOf"] = [*checkpoint.get("anyOf", []), {"type": "boolean"}]
    return schema
