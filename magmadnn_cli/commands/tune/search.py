"""`magmadnn tune`: grid or random search over dotted config paths (MagmaDNN's grid-search engine).

Each trial is the base config with its overrides merged and re-validated; an invalid combination is a
failed trial with its reason. Under MPI, rank 0 is the master: it hands trials to free workers one at
a time (point-to-point), so fast workers are never held by slow ones.
"""

from __future__ import annotations

import csv
import io
import math
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml
from pydantic import ValidationError

from ...config.loading import seeded
from ...config.schema import Config, SearchConfig
from ...distributed import Communicator, SingleProcess
from ...errors import Interrupted, MagmaError
from ... import signals
from ...signals import Interruptible, ignoring_stop_signals
from ...files import atomic_write, disk_full, write_text
from ...reporting import Reporter, grid
from .objective import check_measurable, objective_direction, objective_value, rank_key, second_key, tie_break, weighted
from ...distributed.comm import on_root
from ...training.run_folder import RunFolder, locked, say_replacing
from .search_space import Trials
from .trial_config import Overrides, check_space, one_process, split_layouts, trial_config
from .trial_log import TrialLog, resume_command, saved_seed


class TrialReporter(Reporter):
    """A trial's training says its warnings, not where it wrote its folder: the search says where its
    results went, once."""

    def done(self, text: str) -> None: ...


@dataclass
class Pruner:
    """Median stopping: from epoch `grace` on, a trial is stopped after an epoch whose objective (the
    search's own, computed from that epoch's metrics and the time so far) is worse than the median of
    earlier trials at that epoch ('halving' checks only at epochs 4, 8, 16, ...)."""
    rule: str
    curves: dict[int, list[float]] = field(default_factory=dict)
    min_trials: int = 2
    grace: int = 3
    maximize: bool = False

    def __call__(self, epoch: int, value: float) -> bool:
        if self.rule == "none" or math.isnan(value) or epoch < self.grace:
            return False
        if self.rule == "halving" and epoch & (epoch - 1):
            return False
        earlier = self.curves.get(epoch, [])
        if len(earlier) < self.min_trials:
            return False
        median = statistics.median(earlier)
        return value < median if self.maximize else value > median

    def record(self, curve: list[float]) -> None:
        for epoch, value in enumerate(curve, start=1):
            self.curves.setdefault(epoch, []).append(value)


def run_trial(index: int, base: dict, overrides: Overrides, out_dir: Path, pruner: Pruner) -> dict[str, Any]:
    from ..train import train  # the tuner sits above the training entry point
    result: dict[str, Any] = {"trial": index, "status": "ok", "reason": "", **{f"param:{k}": v for k, v in overrides.items()}}
    started = time.perf_counter()
    curve: list[float] = []  # the objective after each epoch

    def prune(epoch: int, metrics: dict[str, Any]) -> bool:
        curve.append(weighted(search, metrics.get("val_accuracy"), metrics.get("val_loss"),
                              time.perf_counter() - started))
        return pruner(epoch, curve[-1])

    try:
        config = trial_config(base, overrides)
        search = SearchConfig.model_validate(base["search"])
        if search.folds:
            result.update(_cross_validated(one_process(config), search.folds, RunFolder(out_dir).trial(index).path))
            result["time_s"] = round(time.perf_counter() - started, 3)
            return result
        run = train(one_process(config), RunFolder(out_dir).trial(index).path, reporter=TrialReporter(),
                    comm=SingleProcess(), prune=prune, checkpoints=False, overwrite=True)  # a trial killed before it was journaled runs again
    except Exception as exc:  # a crash in one trial is that trial's failure; the search goes on
        signals.check()  # unless it was a stop signal's KeyboardInterrupt that numpy or pyarrow turned into another
        if disk_full(exc):
            raise  # the disk's, not the trial's: every trial would fail so; the search stops, naming the file
        result.update(status="failed", reason=_failure(exc))
    else:
        validation = run.metrics.get("validation", {})
        result.update(val_accuracy=validation.get("accuracy"), val_loss=validation.get("loss"),
                      epochs=run.metrics["epochs_run"], curve=curve,
                      status="pruned" if run.history.pruned else "ok")
    result["time_s"] = round(time.perf_counter() - started, 3)
    return result


def _failure(exc: Exception) -> str:
    """A failed trial's reason, in one line."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    if isinstance(exc, MagmaError):
        return str(exc).splitlines()[0]
    return f"{type(exc).__name__}: {exc}"


def _cross_validated(config: Config, folds: int, out_dir: Path) -> dict[str, Any]:
    """A trial scored by K-fold cross-validation: its validation metrics are the held-out folds'
    means (no pruning: every fold runs its budget)."""
    from ..crossval import train_folds
    _, metrics = train_folds(config, folds, out_dir, TrialReporter(), overwrite=True)
    mean, std = metrics["mean"]["test"], metrics["std"]["test"]
    epochs = [f["epochs_run"] for f in metrics["per_fold"]]
    return {"val_accuracy": mean.get("accuracy"), "val_loss": mean.get("loss"), "cv_std_accuracy": std.get("accuracy"),
            "epochs": round(sum(epochs) / len(epochs), 1), "curve": [], "status": "ok"}


def tune(config: Config, out_dir: Path | None = None, reporter: Reporter | None = None,
         comm: Communicator | None = None, resume: bool = False, overwrite: bool = False) -> list[dict]:
    """Run the search (or, with `resume`, the trials its journal lacks) in a folder chosen by `train`'s
    rule: `out_dir`, refused when it holds an earlier search unless `overwrite` or `resume`; by default
    runs/<name>-tune or its next free version (`resume`: the newest one). Rank 0 returns every trial's
    result (other ranks return [])."""
    if config.search is None or not config.search.space:
        raise MagmaError("search: the config needs a search section with a non-empty space to tune")
    check_space(config.model_dump(mode="json"), config.search)  # every value, then the space's size
    check_measurable(config)
    trials = Trials(config.search)
    comm, reporter = comm or SingleProcess(), reporter or Reporter()
    named = config.name == "tune" or config.name.endswith(("-tune", "_tune"))  # houses_tune: not houses_tune-tune
    wanted = out_dir or Path("runs") / (config.name if named else f"{config.name}-tune")
    if resume and out_dir is None:
        wanted = on_root(comm, lambda: RunFolder.newest_version(wanted, "search"))
    chosen = on_root(comm, lambda: RunFolder.choose(wanted, "search", out_dir is not None, overwrite, continuing=resume))
    with locked(comm, chosen, "search", replace=overwrite and not resume) as lock:
        say_replacing(lock, reporter)
        return _search(config, trials, chosen, reporter, comm, resume, RunFolder.version_note(wanted, chosen, "search"))


def _search(config: Config, trials: Trials, out_dir: Path, reporter: Reporter, comm: Communicator,
            resume: bool, note: str | None) -> list[dict]:
    if config.seed is None:  # the journal's seed on resume, else one drawn for all ranks
        config = seeded(config, comm.bcast, comm.bcast(saved_seed(out_dir) if resume and comm.is_root else None))
    search = config.search
    base = config.model_dump(mode="json")
    log = TrialLog(out_dir, base, resume) if comm.is_root else None
    if comm.is_root and note:  # the search writes its journal: now it has its folder
        reporter.info(note)
    if comm.is_root and (layouts := split_layouts(config)):
        reporter.warn(layouts)
    done = log.done if log else []
    if done:
        reporter.info(f"resuming: {len(done)} of {len(trials)} trial(s) already finished in {log.path}")
    results: list[dict] = list(done)
    stopped = 0
    if comm.size == 1:
        with Interruptible() as stops:  # Ctrl-C or SIGTERM: keep what the finished trials found
            try:
                _sequential(trials, base, out_dir, search, reporter, results, log)
            except KeyboardInterrupt:
                stopped = stops.received or signals.received() or signal.SIGINT
    elif comm.is_root:  # SIGTERM under mpiexec reaches every rank: the master keeps what finished
        with Interruptible() as stops:
            try:
                _master(trials, comm, search, reporter, results, log)
            except KeyboardInterrupt:
                stopped = stops.received or signals.received() or signal.SIGINT
    else:
        with ignoring_stop_signals():  # the master decides, writes the results, and ends the job
            _worker(comm, base, out_dir, search)
    results.sort(key=lambda r: r["trial"])
    if comm.is_root and results:
        write_results(results, base, out_dir, search, reporter)
    if stopped:
        raise _interrupted(stopped, len(results), len(trials), out_dir, comm)
    comm.barrier()
    return results if comm.is_root else []


def _interrupted(stopped: int, finished: int, trials: int, out_dir: Path, comm: Communicator) -> Interrupted:
    """A stopped search: what its finished trials left, and the exact command that continues it."""
    kept = (f"wrote {out_dir}/trials.csv, best_config.yaml and model.npz for them" if finished
            else "nothing was written")
    interrupted = Interrupted(f"stopped by {signal.Signals(stopped).name} after {finished} of {trials} trial(s) "
                              f"finished; {kept}. Continue with: {resume_command(out_dir)}", stopped)
    interrupted.collective = comm.size == 1  # under MPI: end the workers still training (an abort)
    return interrupted


def _to_run(trials: Trials, search: SearchConfig, results: list[dict]) -> Iterator[tuple[int, Overrides]]:
    """(index, overrides) of the trials still to run, in order: none once a finished one reached `stop_when`."""
    if any(_reached(search, r) for r in results):
        return iter(())
    return trials.pending({r["trial"] for r in results})


def _curves(results: list[dict]) -> dict[int, list[float]]:
    """Objective curves of the finished trials, by epoch (for the pruner)."""
    curves: dict[int, list[float]] = {}
    for r in results:
        if r["status"] == "ok":
            for epoch, value in enumerate(r["curve"], start=1):
                curves.setdefault(epoch, []).append(value)
    return curves


def _report(reporter: Reporter, result: dict[str, Any], search: SearchConfig) -> None:
    """One line per trial, values to 4 significant digits, names shortened to what tells them apart."""
    keys = [k for k in result if k.startswith("param:")]
    names = short_names([k.removeprefix("param:") for k in keys])
    params = " ".join(f"{name}={_short(result[k])}" for name, k in zip(names, keys))
    score = objective_value(search, result)
    reason = f" ({result['reason'][:60]})" if result["reason"] else ""
    reporter.info(f"trial {result['trial']:>3} {result['status']:<7} objective={score:.4g} "
                  f"time={result['time_s']:.3g}s {params}{reason}")


def short_names(paths: list[str]) -> list[str]:
    """The fewest trailing parts of each dotted path that still tell it from the others
    (`optimizer.learning_rate` -> `learning_rate`; `model.layers.0.units` and `model.layers.1.units`
    -> `0.units`, `1.units`)."""
    parts = [p.split(".") for p in paths]
    names = []
    for mine in parts:
        for n in range(1, len(mine) + 1):
            tail = mine[-n:]
            if sum(other[-n:] == tail for other in parts) == 1:
                break
        names.append(".".join(tail))
    return names


def _reached(search: SearchConfig, result: dict[str, Any]) -> bool:
    if search.stop_when is None or result["status"] == "failed":
        return False
    value = objective_value(search, result)
    return value >= search.stop_when if objective_direction(search) == "maximize" else value <= search.stop_when


def _sequential(trials: Trials, base: dict, out_dir: Path, search: SearchConfig,
                reporter: Reporter, results: list[dict], log: TrialLog) -> None:
    """Run the trials in turn, appending each result to `results` and the journal as it finishes."""
    pruner = Pruner(search.early_stop, _curves(results), maximize=objective_direction(search) == "maximize")
    todo = len(trials) - len(results)
    for n, (index, overrides) in enumerate(_to_run(trials, search, results)):
        signals.check()  # a stop signal whose KeyboardInterrupt was swallowed (raised in a __del__) still stops
        result = run_trial(index, base, overrides, out_dir, pruner)
        if result["status"] == "ok":
            pruner.record(result["curve"])
        results.append(result)
        log.append(result)
        _report(reporter, result, search)
        if _reached(search, result):
            reporter.info(f"stop_when reached by trial {index}; {todo - n - 1} trial(s) not run")
            break


def _master(trials: Trials, comm: Any, search: SearchConfig, reporter: Reporter,
            results: list[dict], log: TrialLog) -> None:
    """Hand out trial indices to whichever worker is free; collect results (into `results` and the
    journal); tell idle workers to stop."""
    curves = _curves(results)
    queue, busy = _to_run(trials, search, results), 0
    for worker in range(1, comm.size):
        task = next(queue, None)
        comm.send(None if task is None else (*task, curves), worker)
        busy += task is not None
    stop = False
    while busy:
        source, result = comm.recv_any()
        busy -= 1
        results.append(result)
        log.append(result)
        _report(reporter, result, search)
        signals.check()  # (as in _sequential; after the result in hand is kept)
        if result["status"] == "ok":
            for epoch, value in enumerate(result["curve"], start=1):
                curves.setdefault(epoch, []).append(value)
        stop = stop or _reached(search, result)
        task = None if stop else next(queue, None)
        comm.send(None if task is None else (*task, curves), source)
        busy += task is not None


def _worker(comm: Any, base: dict, out_dir: Path, search: SearchConfig) -> None:
    while True:
        task = comm.recv(0)
        if task is None:
            return
        index, overrides, curves = task
        pruner = Pruner(search.early_stop, dict(curves), maximize=objective_direction(search) == "maximize")
        comm.send(run_trial(index, base, overrides, out_dir, pruner), 0)


def write_results(results: list[dict], base: dict, out_dir: Path, search: SearchConfig, reporter: Reporter) -> None:
    params = list(dict.fromkeys(k for r in results for k in r if k.startswith("param:")))
    measured = [m for m in ("val_accuracy", "val_loss") if any(r.get(m) is not None for r in results)] or ["val_loss"]
    columns = ["trial", "status", *params, *measured, *(["cv_std_accuracy"] if search.folds else []),
               "objective", "epochs", "time_s", "reason"]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in results:
        writer.writerow({**{k: (yaml.safe_dump(v, default_flow_style=True).strip() if isinstance(v, (list, dict)) else v)
                            for k, v in r.items()}, "objective": objective_value(search, r)})
    folder = RunFolder(out_dir)
    write_text(folder.trials_table, text.getvalue())
    finished = [r for r in results if r["status"] == "ok" and not math.isnan(objective_value(search, r))]
    if not finished:  # a pruned trial stopped early: its score is not comparable, it is never the best
        first = results[0]
        why = first["reason"] or (f"no value of {search.objective}" if first["status"] == "ok" else first["status"])
        raise MagmaError(f"no trial finished with an objective (failed, pruned or unmeasured); see "
                         f"{folder.trials_table} (trial {first['trial']}: {why})")
    best = min(finished, key=lambda r: rank_key(search, r))
    overrides = {k.removeprefix("param:"): v for k, v in best.items() if k.startswith("param:")}
    best_config = trial_config(base, overrides).model_dump(mode="json")
    write_text(folder.best_config, yaml.safe_dump(best_config, sort_keys=False))
    best_dir = folder.trial(best["trial"])
    if search.folds:  # cross-validated trials keep no model: the best config is trained once, as train would
        from ..train import train
        reporter.info(f"training the best config (trial {best['trial']}) for the search's model.npz")
        best_dir = best_dir.retrained()
        train(one_process(trial_config(base, overrides)), best_dir.path, reporter=TrialReporter(),
              comm=SingleProcess(), checkpoints=False, overwrite=True)
    best_model = best_dir.model.read_bytes()
    atomic_write(folder.model, lambda f: f.write(best_model))
    reporter.table(trials_table(results, search))
    if tie := tie_break(search, best, finished):
        reporter.info(tie)
    reporter.done(f"best: trial {best['trial']} objective={objective_value(search, best):.4f} "
                  f"{overrides}; wrote {out_dir}/trials.csv, best_config.yaml, model.npz")


def trials_table(results: list[dict], search: SearchConfig, top: int = 10) -> Any:
    """The best trials first (ties on the objective broken as the best is chosen), pruned ones after
    the finished ones, failed ones last."""
    second, wins = second_key(search)
    status = {"ok": 0, "pruned": 1}
    ranked = sorted(results, key=lambda r: (status.get(r["status"], 2), rank_key(search, r)))[:top]
    params = list(dict.fromkeys(k for r in ranked for k in r if k.startswith("param:")))
    seconds = [second] if any(r.get(second) is not None for r in results) else []  # regression: no accuracy
    columns = ["trial", "status", *short_names([p.removeprefix("param:") for p in params]), "objective", *seconds,
               "epochs", "time s"]
    rows = [[str(r["trial"]), r["status"], *[_short(r.get(p)) for p in params], f"{objective_value(search, r):.4g}",
             *[_short(r.get(key)) if r.get(key) is not None else "" for key in seconds],
             str(r.get("epochs", "")), f"{r['time_s']:.3g}"] for r in ranked]
    ties = f"{wins} {second}, then trial order" if seconds else "trial order"
    return grid(f"top {len(ranked)} of {len(results)} trials ({search.objective}, {objective_direction(search)}; "
                f"ties: {ties})", columns, rows, left=len(columns))


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
