"""`magmadnn plot`: learning curves of a run (loss and each metric per epoch, train against
validation, the best epoch marked), or a search's objective against each hyperparameter.
matplotlib is an optional extra (`pip install 'magmadnn-cli[plot]'`)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from ..errors import MagmaError
from ..files import atomic_write, check_output_file
from .run_dir import classify


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415 (optional dependency)
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise MagmaError("magmadnn plot needs matplotlib: pip install 'magmadnn-cli[plot]' (or pip install "
                         "matplotlib)") from exc
    return plt


def plot(folder: Path, out: Path | None = None, overwrite: bool = False) -> Path:
    """Write the folder's plot as PNG (default: <folder>/curves.png or objective.png, redrawn each
    time; an existing `out` is replaced only with `overwrite`); returns it."""
    if out is not None:
        check_output_file(out, overwrite=overwrite)
    kind = classify(folder)
    if kind == "run" or (folder / "metrics.csv").is_file():
        figure, name = _learning_curves(folder), "curves.png"
    elif kind == "search" or (folder / "trials.csv").is_file():
        figure, name = _search_scatter(folder), "objective.png"
    else:
        raise MagmaError(f"{folder}: not a magmadnn run (metrics.csv) or search (trials.csv) folder")
    target = out or folder / name
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    _pyplot().close(figure)
    atomic_write(target, lambda f: f.write(buffer.getvalue()))
    return target


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MagmaError(f"{path}: cannot read: {exc}") from exc


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _learning_curves(folder: Path) -> Any:
    rows = _rows(folder / "metrics.csv")
    if not rows:
        raise MagmaError(f"{folder / 'metrics.csv'}: no epochs to plot")
    epochs = [int(_number(r["epoch"])) for r in rows]
    metrics = [k for k in rows[0] if k in ("loss", "accuracy")]
    best = _best_epoch(folder)
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        ax.plot(epochs, [_number(r.get(metric)) for r in rows], label=f"train {metric}", marker=".")
        if f"val_{metric}" in rows[0]:
            ax.plot(epochs, [_number(r.get(f"val_{metric}")) for r in rows], label=f"validation {metric}", marker=".")
        if best is not None:
            ax.axvline(best, color="grey", linestyle="--", label=f"best epoch ({best})")
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    figure.suptitle(f"{folder.name}: learning curves")
    figure.tight_layout()
    return figure


def _best_epoch(folder: Path) -> int | None:
    try:
        value = json.loads((folder / "metrics.json").read_text(encoding="utf-8")).get("best_epoch")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) else None


def _search_scatter(folder: Path) -> Any:
    rows = [r for r in _rows(folder / "trials.csv") if r.get("status") != "failed"]
    params = [k for k in (rows[0] if rows else {}) if k.startswith("param:")]
    if not rows or not params:
        raise MagmaError(f"{folder / 'trials.csv'}: no finished trials with hyperparameters to plot")
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(params), figsize=(5 * len(params), 4), squeeze=False)
    for ax, param in zip(axes[0], params):
        xs = [_number(r[param]) for r in rows]
        numeric = not any(math.isnan(x) for x in xs)
        labels = [r[param] for r in rows]
        positions = xs if numeric else [sorted(set(labels)).index(v) for v in labels]
        for status, marker in (("ok", "o"), ("pruned", "x")):
            chosen = [i for i, r in enumerate(rows) if r["status"] == status]
            ax.scatter([positions[i] for i in chosen], [_number(rows[i]["objective"]) for i in chosen],
                       marker=marker, label=status)
        if numeric and min(xs) > 0 and max(xs) / min(xs) > 50:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(set(labels))), sorted(set(labels)))
        ax.set_xlabel(param.removeprefix("param:"))
        ax.set_ylabel("objective")
        ax.grid(alpha=0.3)
        ax.legend()
    figure.suptitle(f"{folder.name}: objective by hyperparameter")
    figure.tight_layout()
    return figure
