"""What `magmadnn serve` says at GET /metadata: the model's inputs, outputs, metrics and provenance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ... import __version__
from ...data.fitting import column_strategy
from ...files import file_sha256, json_object
from ...inference import Predictor
from ...inference.encoding import fill_of
from ...training.run_folder import RunFolder
from .images import input_entry, settings


def metadata(model: Predictor) -> dict[str, Any]:
    """What /metadata says: the inputs (an image model's: one image, as it is decoded and sent; else
    each column's type, categories and what a missing cell does), the outputs and labels, the training
    metrics, the tool's version and the model file's sha256."""
    saved = model.saved
    cfg = saved.config.data
    inputs = [input_entry(cfg)] if settings(cfg) is not None else _columns(model)
    return {"model": str(model.path), "sha256": file_sha256(Path(model.path)), "magmadnn_version": __version__,
            "task": saved.task,
            "inputs": inputs, "unseen_categories": saved.encoder.unseen,
            "outputs": {"columns": model.columns(model.task != "regression").names,
                        "labels": [str(c) for c in saved.classes] if model.task != "regression" else None},
            "metrics": _run_metrics(Path(model.path), saved.metrics) or saved.metrics}


def _columns(model: Predictor) -> list[dict[str, Any]]:
    """A table model's inputs: each column's name, type, categories and what a missing cell does."""
    saved = model.saved
    cfg = saved.config.data
    columns = {c.name: c for c in saved.encoder.columns}
    inputs = []
    for name in saved.features:
        column = columns.get(name)
        kind = column.kind if column is not None else "number"
        entry: dict[str, Any] = {"name": name, "type": kind}
        if column is not None and column.kind == "category":
            entry["categories"] = list(column.categories)
        if column is None:  # a model of numbers only, fitted without an encoding: complete rows only
            entry["missing"] = "refused"
        elif column.kind != "constant":
            refused = column_strategy(cfg.column_spec(name).missing, cfg.missing_values, column.kind) == "error"
            entry["missing"] = "refused" if refused else f"filled: {fill_of(saved, name)}"
        inputs.append(entry)
    return inputs


def _run_metrics(path: Path, recorded: dict[str, Any]) -> dict[str, Any] | None:
    """The run's metrics.json beside the model file (its scores on each split), where it is this
    run's (the same data sha256 as the model records); None otherwise."""
    found = json_object(RunFolder(path.parent).metrics)
    return found if found and found.get("data_sha256") == recorded.get("data_sha256") \
        and found.get("name") == recorded.get("name") else None
