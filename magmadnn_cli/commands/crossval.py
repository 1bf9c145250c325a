"""`magmadnn train CONFIG --folds K`: K-fold cross-validation (Ludwig's `experiment --k_fold`,
scikit-learn's `cross_validate`), stratified by class for classification and shuffled for regression.
Fold k holds out every K-th row of the seeded (stratified) order as its test split and trains on the
rest (data.validation_split of them kept for validation); the report is each metric's mean and
standard deviation over the folds. Under MPI the folds are dealt to the ranks (fold k on rank k mod
N), each training alone. The run folder follows `train`'s rule (RunFolder) and is marked as a
cross-validation, which writes no model."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from ..config.loading import seeded
from ..config.schema import Config
from ..config.tasks import task_named
from ..distributed import Communicator, SingleProcess
from ..errors import MagmaError
from ..files import file_sha256, write_json, write_text
from ..reporting import Reporter, metrics_table
from ..core import backend as B
from ..data.prepare import Prepared
from ..training.builder import select_backend
from ..distributed.comm import on_root
from ..training.run_folder import FolderLock, RunFolder, locked, say_replacing
from .train import SPLITS, build, final_metrics


def fold_metrics(config: Config, k: int, folds: int,
                 checked: Callable[[], None] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Train on every fold but k and report each split's metrics (fold k is the test split), with
    what the data preparation noted (types inferred, cells imputed). `checked` is called once the
    fold's run has passed its checks, before it trains."""
    started = time.perf_counter()
    with B.using(select_backend(config, SingleProcess())):
        run = build(config, SingleProcess(), Reporter(), None, None, fold=(k, folds))
        _enough_rows(run.data, folds)
        if checked is not None:
            checked()
        history = run.fit()
        run.trainer.check_weights()
        thin = _thin_class(run.data, folds) if k == 0 else None
        return ({"fold": k + 1, **final_metrics(run, history, time.perf_counter() - started)},
                run.data.notes + ([thin] if thin else []))


def _enough_rows(data: Prepared, folds: int) -> None:
    """Every fold must hold rows: K folds need K rows at least (checked on fold 1, before it trains)."""
    rows = sum(len(split.x) for split in (data.train, data.validation, data.test) if split is not None)
    if folds > rows:
        raise MagmaError(f"{folds} folds: {data.source} has {rows} rows, so some folds would "
                         f"hold none; use at most {rows} folds (--folds / search.folds)")


def _thin_class(data: Prepared, folds: int) -> str | None:
    """More folds than a class has rows: some test folds hold none of it, and their MCC and macro scores
    leave it out (scikit-learn's StratifiedKFold warns alike)."""
    if not data.classes or len(data.classes) < 2:
        return None
    labels = np.concatenate([split.y.reshape(-1) for split in (data.train, data.validation, data.test)
                             if split is not None]).astype(np.int64)
    counts = np.bincount(labels, minlength=len(data.classes))
    fewest = int(np.argmin(counts))
    if folds <= counts[fewest]:
        return None
    return (f"{folds} folds, but class {str(data.classes[fewest])!r} has {counts[fewest]} rows: some folds' test "
            f"rows hold none of it, and their MCC and macro scores leave it out; use at most {counts[fewest]} folds")


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per split and metric: the mean and the standard deviation (numpy's, ddof 0) over the folds."""
    out: dict[str, dict[str, dict[str, float]]] = {"mean": {}, "std": {}}
    for split in SPLITS:
        keys = [k for k, v in results[0].get(split, {}).items() if isinstance(v, (int, float))]
        for key in keys:
            values = np.array([r[split][key] for r in results if r.get(split) and r[split].get(key) is not None],
                              dtype=np.float64)
            if values.size:
                out["mean"].setdefault(split, {})[key] = float(values.mean())
                out["std"].setdefault(split, {})[key] = float(values.std())
    return out


def train_folds(config: Config, folds: int, out_dir: Path | None = None, reporter: Reporter | None = None,
                comm: Communicator | None = None, overwrite: bool = False) -> tuple[Path, dict[str, Any]]:
    """`train --folds K`: the seed (drawn once for all ranks if unset) and the run folder chosen as
    `train` chooses them (--out, or runs/<name> or its next free version), then `cross_validate`."""
    comm, reporter = comm or SingleProcess(), reporter or Reporter()
    config = seeded(config, comm.bcast)
    wanted = out_dir or Path("runs") / config.name
    chosen = on_root(comm, lambda: RunFolder.choose(wanted, "run", out_dir is not None, overwrite))
    note = RunFolder.version_note(wanted, chosen, "run")
    return chosen, cross_validate(config, folds, chosen, reporter, comm, note, overwrite)


def cross_validate(config: Config, folds: int, out_dir: Path, reporter: Reporter, comm: Communicator | None = None,
                   note: str | None = None, replace: bool = False) -> dict[str, Any]:
    """Run the K folds (dealt over the ranks), write metrics.json (per fold, mean, std), metrics.csv
    (one row per fold) and config.yaml to `out_dir`; return the metrics (on every rank). `note` (where
    the run writes) is said once fold 1 has passed its checks; `replace`: an earlier run in `out_dir`
    is set aside until the results are written, put back if they are not (--overwrite)."""
    comm = comm or SingleProcess()
    if config.data.validation is not None or config.data.test is not None:
        raise MagmaError("--folds splits data.train into folds; data.validation / data.test files are not used by "
                         "cross-validation: remove them (or train without --folds)")
    started = time.perf_counter()
    how = "stratified" if config.data.stratify and task_named(config.loss.task).labels else "shuffled"
    reporter.info(f"{config.name}: {folds}-fold cross-validation ({how}, seed {config.seed}), {comm.size} process(es)"
                  + ("; data.test_split is not used: each fold holds out 1/K of the rows" if config.data.test_split else ""))
    with locked(comm, out_dir, "run", {"folds": folds}, replace) as lock:
        results = _run_folds(config, folds, comm, reporter, lambda: _begin(lock, note, reporter))
        metrics = {"name": config.name, "folds": folds, "processes": comm.size,
                   "wall_time_s": round(time.perf_counter() - started, 3),
                   "data_sha256": file_sha256(config.data.train), **summarize(results), "per_fold": results}
        if comm.is_root:
            _write(out_dir, config, metrics)
            rows = {f"{split} {stat}": metrics[stat][split] for split in ("test", "train")
                    for stat in ("mean", "std") if split in metrics[stat]}
            reporter.table(metrics_table(f"{config.name} — {folds}-fold cross-validation (test = the held-out fold)", rows))
            reporter.done(f"wrote {out_dir}/metrics.json, metrics.csv, config.yaml (no model: train without --folds "
                          "for one)")
        comm.barrier()
    return metrics


def _run_folds(config: Config, folds: int, comm: Communicator, reporter: Reporter,
               begin: Callable[[], None]) -> list[dict[str, Any]]:
    """This rank's folds (k = rank, rank + N, ...), each said as it ends, then every rank's, in fold
    order (the others' said once gathered). Fold 1 runs on rank 0: once it has passed its checks,
    `begin` claims the folder."""
    mine = {}
    for k in range(comm.rank, folds, comm.size):
        mine[k], notes = fold_metrics(config, k, folds, begin if k == 0 else None)
        for note in notes if k == comm.rank else []:  # said once (fold 1's training rows)
            reporter.info(note)
        _say(reporter, mine[k], folds)
    gathered = {k: r for part in comm.allgather(mine) for k, r in part.items()}
    for k in sorted(set(gathered) - set(mine)):  # the other ranks' folds, said by this one (rank 0 speaks)
        _say(reporter, gathered[k], folds)
    return [gathered[k] for k in range(folds)]


def _begin(lock: FolderLock | None, note: str | None, reporter: Reporter) -> None:
    """The run starts writing its folder: say where (when not the default folder), and that the
    earlier run it replaces (--overwrite) is set aside until it has written its results."""
    if note:
        reporter.info(note)
    say_replacing(lock, reporter)


def _say(reporter: Reporter, result: dict[str, Any], folds: int) -> None:
    test = result["test"]
    shown = " ".join(f"{k}={test[k]:.4f}" for k in ("accuracy", "mcc", "r2", "loss") if k in test)
    reporter.info(f"fold {result['fold']}/{folds}: held-out {shown} ({result['epochs_run']} epochs, "
                  f"{result['wall_time_s']:.1f} s)")


def _write(out_dir: Path, config: Config, metrics: dict[str, Any]) -> None:
    folder = RunFolder(out_dir)
    write_json(folder.metrics, metrics)
    columns = ["fold"] + [f"{split}_{k}" for split in SPLITS for k in metrics["mean"].get(split, {})]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for r in metrics["per_fold"]:
        writer.writerow([r["fold"]] + [r.get(c.split("_", 1)[0], {}).get(c.split("_", 1)[1], "") for c in columns[1:]])
    write_text(folder.history, text.getvalue())
    write_text(folder.config, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
