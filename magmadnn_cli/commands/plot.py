"""`magmadnn plot`: learning curves of a run (loss and each metric per epoch, train against
validation, the best epoch marked), a cross-validation's metrics per fold (each split's line and its
mean over the folds), or a search's objective against each hyperparameter. matplotlib is an optional
extra (`pip install 'magmadnn-cli[plot]'`)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from ..errors import MagmaError
from ..files import atomic_write, check_output_file, json_object
from ..training.run_folder import RunFolder, is_made, record_made

SPLITS = ("train", "validation", "test")
FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}  # -o's suffix: the format written
LARGEST = 1e300  # beyond it matplotlib cannot scale an axis (its range overflows): drawn as a gap, as inf and nan


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend (the optional [plot] extra)."""
    try:
        import matplotlib  # optional dependency
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MagmaError("drawing a plot needs matplotlib: pip install 'magmadnn-cli[plot]' (or pip install "
                         "matplotlib)") from exc
    return plt


def plot(folder: Path, out: Path | None = None, overwrite: bool = False) -> Path:
    """Write the folder's plot (default: <folder>/curves.png, folds.png or objective.png, redrawn each
    time; `out`: PNG, PDF or SVG by its suffix, an existing one replaced only with `overwrite`, never a
    file of a run or search); returns it."""
    if out is not None:
        _refuse_a_runs_file(out, folder)
        check_output_file(out, overwrite=overwrite)
    image = image_format(out) if out is not None else "png"
    figure, name = _figure(folder)
    target = out or folder / name
    if out is None and target.exists() and not is_made(target):  # a file of a person's, not an earlier plot
        check_output_file(target, overwrite=overwrite, given=False)
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format=image, dpi=100)
    except (ValueError, OverflowError, ArithmeticError) as exc:  # numpy's LinAlgError is a ValueError
        raise MagmaError(f"{folder}: its values cannot be drawn ({type(exc).__name__}: {exc})") from exc
    finally:
        pyplot().close(figure)
    atomic_write(target, lambda f: f.write(buffer.getvalue()))
    record_made(target, buffer.getvalue())
    return target


def image_format(out: Path) -> str:
    """The image format `-o`'s suffix names (png, pdf, svg), or the refusal of any other (plot, lr-find)."""
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise MagmaError(f"--output {out}: plots are written as .png, .pdf or .svg files, chosen by the name's suffix "
                         f"(got {repr(out.suffix) if out.suffix else 'no suffix'}); give a name ending in one of them")
    return FORMATS[suffix]


def _refuse_a_runs_file(out: Path, folder: Path) -> None:
    """`-o` never replaces a file of a run or search (model, metrics, config, checkpoints, journal), not
    even with --overwrite; a plot magmadnn drew there it may."""
    if not out.is_file() or out.is_symlink() or is_made(out):
        return
    plotted = folder.resolve()
    for parent in out.resolve().parents:
        if RunFolder(parent).marker.is_file() or parent == plotted:
            kind = RunFolder(parent).kind()
            whose = f"the {kind} {parent}" if kind in ("run", "search") else f"{parent}, the folder it plots"
            raise MagmaError(f"--output {out}: is a file of {whose}; plot never replaces one, not even with "
                             "--overwrite (give a new file name)")


def _figure(folder: Path) -> tuple[Any, str]:
    """The folder's figure and its default file name, by what the folder holds."""
    if not folder.is_dir():
        raise MagmaError(f"{folder}: {'is a file' if folder.exists() else 'no such folder'}; plot takes a run or "
                         "search folder (the --out of train or tune)")
    run = RunFolder(folder)
    kind, metrics = run.kind(), run.history
    ended = run.metrics.is_file()  # written last: a run without it is running or was stopped
    if kind == "run" and not ended and (checkpoints := _checkpoints(folder)):
        return _learning_curves(folder, _checkpointed_rows(checkpoints[-1])), "curves.png"
    if metrics.is_file():
        if "fold" in _columns(metrics) and "epoch" not in _columns(metrics):  # `train --folds`
            return _cross_validation(folder), "folds.png"
        return _learning_curves(folder), "curves.png"
    if kind == "search" or run.trials_table.is_file():
        return _search_scatter(folder), "objective.png"
    if kind == "run":
        raise MagmaError(f"{folder}: no metrics.csv and no checkpoint yet: a run writes both after each epoch "
                         "(training.checkpoint), and metrics.csv again when it ends")
    raise MagmaError(f"{folder}: not a magmadnn run (metrics.csv) or search (trials.csv) folder")


def _columns(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MagmaError(f"{path}: cannot read: {exc}") from exc


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MagmaError(f"{path}: cannot read: {exc}") from exc


def _number(text: Any) -> float:
    """A cell's value; nan (a gap in the line) for an empty cell, text, and values that cannot be
    drawn: nan, infinities and magnitudes beyond LARGEST."""
    try:
        value = float(text) if text not in (None, "") else math.nan
    except (TypeError, ValueError):
        return math.nan
    return value if abs(value) <= LARGEST else math.nan


def _whole(source: Path, rows: list[dict[str, Any]], column: str) -> list[int]:
    """The column's whole numbers (epoch, fold), or the error naming the line of one that is not."""
    if column not in rows[0]:
        found = ", ".join(str(k) for k in rows[0] if k is not None)
        raise MagmaError(f"{source}: no column {column!r} (its columns: {found or 'none'}); expected the file "
                         "magmadnn writes")
    numbers = []
    for line, row in enumerate(rows, start=2):
        value = _number(row.get(column))
        if math.isnan(value) or value != int(value):
            raise MagmaError(f"{source}: line {line}: {column} {row.get(column)!r} is not a whole number")
        numbers.append(int(value))
    return numbers


def _checkpoints(folder: Path) -> list[Path]:
    return RunFolder(folder).checkpoint_files()


def _checkpointed_rows(path: Path) -> tuple[list[dict[str, Any]], str]:
    """The epochs a checkpoint holds (a run that has not ended, or was stopped), and a title note."""
    from ..training.checkpoint import read, unpack
    from ..training.history import epochs_of
    ckpt = read(path)
    try:
        rows = epochs_of(unpack(ckpt.meta["state"], ckpt.arrays)["trainer"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MagmaError(f"{path}: corrupt checkpoint ({type(exc).__name__}: {exc})") from exc
    return rows, f" (not ended: the epochs of {path.name})"


def _learning_curves(folder: Path, checkpointed: tuple[list[dict[str, Any]], str] | None = None) -> Any:
    source = RunFolder(folder).history
    rows, note = checkpointed or (_rows(source), "")
    if not rows:
        raise MagmaError(f"{source}: no epochs to plot")
    epochs = _whole(source, rows, "epoch")
    metrics = [k for k in rows[0] if k in ("loss", "accuracy")]
    if not metrics:
        raise MagmaError(f"{source}: no loss or accuracy column to plot (its columns: "
                         f"{', '.join(str(k) for k in rows[0] if k is not None)})")
    best, why = _best_epoch(folder, rows)
    marker = "." if len(rows) <= 100 else None  # thousands of dots would draw a band
    plt = pyplot()
    figure, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        ax.plot(epochs, [_number(r.get(metric)) for r in rows], label=f"train {metric}", marker=marker)
        if f"val_{metric}" in rows[0]:
            ax.plot(epochs, [_number(r.get(f"val_{metric}")) for r in rows], label=f"validation {metric}",
                    marker=marker)
        if best is not None:
            ax.axvline(best, color="grey", linestyle="--", label=f"{why} ({best})")
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    figure.suptitle(f"{folder.name}: learning curves{note}")
    figure.tight_layout()
    return figure


def _best_epoch(folder: Path, rows: list[dict[str, Any]]) -> tuple[int | None, str]:
    """Early stopping's best epoch (metrics.json), else the epoch of the lowest validation loss."""
    value = json_object(RunFolder(folder).metrics).get("best_epoch")
    if isinstance(value, int):
        return value, "best epoch"
    losses = [(_number(r.get("val_loss")), int(_number(r["epoch"]))) for r in rows]
    losses = [pair for pair in losses if not math.isnan(pair[0])]
    return (min(losses)[1], "lowest validation loss") if losses else (None, "")


def _cross_validation(folder: Path) -> Any:
    """One panel per metric: its value in each fold, one line per split, and each split's mean over
    the folds (dashed, in the split's colour)."""
    source = RunFolder(folder).history
    rows = _rows(source)
    if not rows:
        raise MagmaError(f"{source}: no folds to plot")
    columns = [c.split("_", 1) for c in rows[0] if "_" in c and c.split("_", 1)[0] in SPLITS]
    metrics = list(dict.fromkeys(metric for _, metric in columns))
    splits = [s for s in SPLITS if any(split == s for split, _ in columns)]
    folds = _whole(source, rows, "fold")
    plt = pyplot()
    width = min(2, len(metrics))
    height = math.ceil(len(metrics) / width)
    figure, axes = plt.subplots(height, width, figsize=(5 * width, 4 * height), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        _fold_panel(ax, metric, splits, folds, rows)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    figure.suptitle(f"{folder.name}: {len(folds)}-fold cross-validation")
    figure.tight_layout()
    return figure


def _fold_panel(ax: Any, metric: str, splits: list[str], folds: list[int], rows: list[dict[str, str]]) -> None:
    for split in splits:
        values = [_number(r.get(f"{split}_{metric}")) for r in rows]
        present = [v for v in values if not math.isnan(v)]
        if not present:
            continue
        line, = ax.plot(folds, values, marker="o", label=split)
        mean = statistics.fmean(present)
        ax.axhline(mean, color=line.get_color(), linestyle="--", alpha=0.7, label=f"{split} mean {mean:.4g}")
    ax.set_title(metric)
    ax.set_xlabel("fold")
    ax.set_xticks(folds)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _search_scatter(folder: Path) -> Any:
    table = RunFolder(folder).trials_table
    rows = [r for r in _rows(table) if r.get("status") != "failed"]
    params = [k for k in (rows[0] if rows else {}) if k is not None and k.startswith("param:")]
    missing = [k for k in ("trial", "status", "objective") if rows and k not in rows[0]]
    if missing:
        raise MagmaError(f"{table}: no column {', '.join(map(repr, missing))}; expected the "
                         "trials.csv that magmadnn tune writes")
    if not rows or not params:
        raise MagmaError(f"{table}: no finished trials with hyperparameters to plot")
    best, ylabel = _best_trial(folder, rows)
    plt = pyplot()
    figure, axes = plt.subplots(1, len(params), figsize=(5 * len(params), 4), squeeze=False)
    for ax, param in zip(axes[0], params):
        xs = [_number(r[param]) for r in rows]
        numeric = not any(math.isnan(x) for x in xs)
        labels = [r[param] for r in rows]
        positions = xs if numeric else [sorted(set(labels)).index(v) for v in labels]
        for status, marker, label in (("ok", "o", "finished"), ("pruned", "x", "pruned (stopped early)")):
            chosen = [i for i, r in enumerate(rows) if r["status"] == status]
            if chosen:  # the legend names only what the search holds
                ax.scatter([positions[i] for i in chosen], [_number(rows[i]["objective"]) for i in chosen],
                           marker=marker, label=label)
        if best is not None:
            ax.scatter([positions[best]], [_number(rows[best]["objective"])], marker="*", s=250, color="gold",
                       edgecolors="black", zorder=3, label=f"best (trial {rows[best]['trial']})")
        if numeric and min(xs) > 0 and max(xs) / min(xs) > 50:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(set(labels))), sorted(set(labels)))
        ax.set_xlabel(param.removeprefix("param:"))
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    figure.suptitle(f"{folder.name}: objective by hyperparameter")
    figure.tight_layout()
    return figure


def _best_trial(folder: Path, rows: list[dict[str, str]]) -> tuple[int | None, str]:
    """The row of the trial the search chose (ranked by its journal, as `tune` ranked them) and the y
    axis's label (the objective and its direction); (None, "objective") without a readable journal."""
    from pydantic import ValidationError

    from ..config.schema import SearchConfig
    from .tune.objective import objective_direction, objective_value, rank_key
    from .tune.trial_log import read
    try:
        base, done = read(RunFolder(folder).journal)
        search = SearchConfig.model_validate(base.get("search") or {})
    except (MagmaError, ValidationError, AttributeError):
        return None, "objective"
    named = search.objective if isinstance(search.objective, str) else "objective (weighted)"
    label = f"{named} ({'higher' if objective_direction(search) == 'maximize' else 'lower'} is better)"
    try:
        finished = [r for r in done if isinstance(r, dict) and r.get("status") == "ok"
                    and not math.isnan(objective_value(search, r))]
        best = str(min(finished, key=lambda r: rank_key(search, r))["trial"]) if finished else None
    except (KeyError, TypeError, ValueError):  # a journal edited by hand: no mark rather than a wrong one
        return None, label
    return next((i for i, r in enumerate(rows) if r["trial"] == best and r["status"] == "ok"), None), label
