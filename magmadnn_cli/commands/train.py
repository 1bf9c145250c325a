"""`magmadnn train`: build (config -> data -> network -> trainer, every check) -> fit -> report -> run directory."""

from __future__ import annotations

import math
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config.loading import seeded
from ..config.schema import Config
from ..core import backend as B
from ..data.column_kinds import own_missing_category
from ..data.image_folder import decode_progress, looking_only
from ..data.prepare import Prepared
from ..distributed import Communicator, SingleProcess
from ..errors import ConfigError, MagmaError
from ..files import file_sha256, write_json, write_text
from ..reporting import Reporter, metrics_table
from ..training.advice import last_checkpoint_note
from ..training.builder import Run, build_optimizer, build_run, select_backend
from ..training.run_checks import bias_warnings
from ..training.checkpoint import Checkpoint, check_compatible, check_config_matches, load_for_resume, restore
from ..training.evaluation import split_report
from ..training.modelfile import save as save_model
from ..training.history import History
from ..training.trainer import Trainer
from ..training.tracking import check_tracking, tracked
from ..distributed.comm import on_root
from ..training.run_folder import FolderLock, RunFolder, locked, remove_made, say_replacing


@dataclass
class RunResult:
    out_dir: Path
    metrics: dict[str, Any]
    history: History


def train(config: Config, out_dir: Path | None = None, init_from: Path | None = None, reporter: Reporter | None = None,
          comm: Communicator | None = None, prune: Any = None, resume: Path | None = None,
          checkpoints: bool = True, overwrite: bool = False) -> RunResult:
    """Build, fit, report. `out_dir` defaults to runs/<name> (or its next free version, runs/<name>-2,
    ..., when it holds an earlier run), or to the run that `resume` (a checkpoint or run dir) names.
    An explicit `out_dir` holding an earlier run is refused unless `overwrite`."""
    comm = comm or SingleProcess()
    reporter = reporter or Reporter()
    started = time.perf_counter()
    config, ckpt = _starting_point(config, init_from, resume, comm)
    out_dir, moved = output_folder(out_dir, ckpt, config, comm, overwrite)
    replace = overwrite and (ckpt is None or os.path.abspath(out_dir) != os.path.abspath(RunFolder.holding(ckpt.path).path))
    run: Run | None = None  # built inside the watched block: the watchdog asks it for the newest checkpoint
    saved = lambda: last_checkpoint_note(run.saver.last if run and run.saver else None, comm.size)  # noqa: E731
    # watched from the first collective to the last: a rank that stops answering in any ends the job
    with locked(comm, out_dir, "run", replace=replace) as lock, B.using(select_backend(config, comm)), \
            tracked(reporter, config, out_dir, comm, resumed=ckpt is not None) as reporter, \
            comm.watched(config.distributed.timeout, saved):
        run = build(config, comm, reporter, RunFolder(out_dir) if checkpoints else None, init_from)
        _start(run, out_dir, ckpt, init_from, moved, reporter, lock)
        history = run.fit(prune)
        run.trainer.check_weights()
        metrics = final_metrics(run, history, time.perf_counter() - started)
        weights = run.network.state_dict()  # on every rank: split layers are gathered whole
        if comm.is_root:
            _write_and_report(run, out_dir, weights, metrics, history, reporter, resumed=ckpt is not None)
        comm.barrier()
    return RunResult(out_dir, metrics, history)


def _start(run: Run, out_dir: Path, ckpt: Checkpoint | None, init_from: Path | None, moved: str | None,
           reporter: Reporter, lock: FolderLock | None) -> None:
    """Before the first step: say where the run goes, what it starts from and any earlier run it
    replaces, restore a checkpoint, begin this invocation's segment, and write the resolved config."""
    comm = run.comm
    if moved:  # said once the run's checks have passed: a refused run claims no folder
        reporter.info(moved)
    if run.trainer.origin is not None:
        reporter.info(f"starting from the weights of {run.trainer.origin['path']}")
    if tip := idle_cores_tip(run):
        reporter.info(tip)
    if ckpt is not None:
        _resume(ckpt, run, reporter)
    say_replacing(lock, reporter)
    layout = how_it_runs(run)
    run.trainer.segments.begin(run.trainer.position.epoch, comm.size, layout.get("strategy"))
    run.choose_convolutions()  # before the config is written: it says the algorithms the run uses
    if comm.is_root:  # at once (a resumed run's too, its --set kept): a stopped run is resumed from it
        write_config(out_dir, run.resolved, {"init_from": run.trainer.origin, "distributed": layout})


def _write_and_report(run: Run, out_dir: Path, weights: dict[str, Any], metrics: dict[str, Any], history: History,
                      reporter: Reporter, resumed: bool) -> None:
    """Rank 0: the run's files, then the final metrics and what they say of the model (a fresh run's
    folder set its earlier run's export aside with that run as it started: `say_replacing`)."""
    if resumed:
        drop_stale_export(out_dir, reporter)
    write_outputs(out_dir, run.resolved, run.network, weights, run.data, run.task,
                  metrics, history)
    reporter.table(metrics_table(f"{run.config.name} — final metrics", {k: v for k, v in metrics.items() if k in SPLITS},
                                 _units(run.data)))
    if collapsed := one_class_note(metrics.get("train", {}), run.config):
        reporter.warn(collapsed)
    reporter.done(f"wrote {out_dir}/model.npz, metrics.json, metrics.csv, config.yaml"
                  + (", checkpoints/" if run.saver is not None and run.saver.last is not None else ""))


def _starting_point(config: Config, init_from: Path | None, resume: Path | None,
                    comm: Communicator) -> tuple[Config, Checkpoint | None]:
    """The config with its seed (drawn once for all ranks, or the resumed run's) and the checkpoint
    to resume, refused before anything is read or said if the config cannot continue it."""
    if init_from is not None and resume is not None:
        raise MagmaError("--resume continues a training (weights, optimizer, position); --init-from starts a "
                         "new one from a model's weights: give one of them")
    ckpt = load_for_resume(resume, comm) if resume is not None else None
    config = seeded(config, comm.bcast, ckpt.meta["config"].get("seed") if ckpt else None)
    if ckpt is not None:
        check_config_matches(ckpt, config)  # before the run's header and data notes: the refusal alone
    return config, ckpt


def drop_stale_export(out_dir: Path, reporter: Reporter) -> None:
    """The run folder's model.onnx, if export wrote it there, was exported from the model this run
    replaces (a resumed run's earlier end): removed, as it no longer gives this model's predictions.
    A model.onnx of a person's own stays, said."""
    onnx = RunFolder(out_dir).onnx
    had = onnx.is_file()
    if remove_made(onnx):
        reporter.warn(f"kept {onnx}: not written by magmadnn export (or changed since), so not removed; it does not "
                      f"describe the model this run writes (magmadnn export {out_dir} --overwrite replaces it)")
    elif had:
        reporter.info(f"removed {onnx}: exported from the model this run replaces; magmadnn export {out_dir} "
                      "writes this one's")


def output_folder(given: Path | None, ckpt: Checkpoint | None, config: Config, comm: Communicator,
                  overwrite: bool) -> tuple[Path, str | None]:
    """--out, the resumed run's folder, or runs/<name> (its next free version when it holds a run). A
    resume continues in the checkpoint's own run folder (or any folder, for a checkpoint kept
    outside a run); another run's folder is only replaced with --overwrite. Also returns the line
    that says a new version was chosen (None when the wanted folder is used)."""
    origin = RunFolder.holding(ckpt.path) if ckpt is not None else None  # the run the checkpoint belongs to
    wanted = given or (origin.path if origin else None) or Path("runs") / config.name
    continuing = origin is not None and (os.path.abspath(wanted) == os.path.abspath(origin.path) or origin.kind() != "run")
    explicit = given is not None or ckpt is not None
    chosen = on_root(comm, lambda: RunFolder.choose(wanted, "run", explicit, overwrite, continuing))
    return chosen, RunFolder.version_note(wanted, chosen, "run")


def build(config: Config, comm: Communicator, reporter: Reporter | None = None, folder: RunFolder | None = None,
          init_from: Path | None = None, fold: tuple[int, int] | None = None) -> Run:
    """The run (`build_run`, on the current backend) and what it says about itself before its first step."""
    reporter = reporter or Reporter()
    with decode_progress(reporter.info):  # a large image folder's first decode says how far it is
        run = build_run(config, comm, reporter, folder, init_from, fold)
    reporter.info(f"{config.name}: {len(run.data.train.x)} training rows, {run.network.num_parameters:,} "
                  f"parameters, device {run.backend.device}, {comm.size} process(es), seed {config.seed}")
    if comm.is_root and (record := how_it_runs(run)):
        reporter.info(f"distributed: {in_words(record)}")
    if comm.is_root and (sharing := B.gpu_sharing(comm.local_size)):
        reporter.warn(sharing)
    if comm.is_root and run.backend.half and run.backend.device == "cpu":
        reporter.info(f"precision: {config.precision} on the CPU emulates the GPU's numerics ({run.backend.half} "
                      "operands, float32 sums) to check a model; it is slower than float32 here, not faster")
    for note in [n for n in (run.trainer.parallel.layout(), *run.data.notes) if n] if comm.is_root else []:
        reporter.info(note)
    for note in bias_warnings(config.model.layers) if comm.is_root else []:
        reporter.warn(note)
    return run


def idle_cores_tip(run: Run) -> str | None:
    """A one-process run inside a Slurm allocation of several tasks: `--processes auto` uses them. On
    one process a CPU convolutional network runs all but its GEMMs on one core (numpy): the
    data-parallel ranks that would use the others (same steps; 1.5x faster on 2 cores, docs/performance.md)."""
    from ..distributed.hosts import slurm_tasks
    if run.comm.size == 1 and (tasks := slurm_tasks() or 0) > 1:
        return (f"tip: this Slurm allocation has {tasks} tasks and this run uses one process: `--processes auto` "
                "trains on all of them, the same steps (docs/clusters.md)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if run.comm.size > 1 or run.backend.device != "cpu" or cores < 2 or not run.network.conv_algorithms():
        return None
    return (f"tip: `--processes {cores}` (or distributed.processes: {cores}) trains this CNN on all {cores} cores, "
            "the same steps; one process runs all but the matrix products on one core (LeNet-5 on 2 cores: "
            "1.5x faster per epoch)")


def validate_run(config: Config) -> list[str]:
    """Every check `train` makes before its first step, without training or writing, and `tune`'s
    of a search space: `validate`. Returns what training would say of the data (types, fills, ...)."""
    if config.search is not None:
        from .tune.trial_config import check_space
        check_space(config.model_dump(mode="json"), config.search)
    check_tracking(config.tracking)
    with B.using(select_backend(config, SingleProcess())):
        with looking_only(check=True):  # an image folder: listed, each file checked, one image decoded
            return build(config, SingleProcess()).data.notes


SPLITS = ("train", "validation", "test")


def final_metrics(run: Run, history: History, seconds: float) -> dict[str, Any]:
    """The metrics of the trained network on every split (exact on any rank count)."""
    data, batch = run.data, run.config.training.eval_batch_size
    final = {name: split_report(run.network, split, data.classes, run.task, run.trainer.data_comm, batch, data.targets)
             for name, split in zip(SPLITS, (data.train, data.validation, data.test)) if split is not None}
    return {"name": run.config.name, "task": run.task, "device": run.backend.device, "processes": run.comm.size,
            "epochs_run": len(history.epochs), "stopped_early": history.stopped_early, "pruned": history.pruned,
            "best_epoch": history.best_epoch, **run.trainer.segments.record(seconds, len(history.epochs)),
            "parameters": run.network.num_parameters, "data_sha256": file_sha256(run.config.data.train),
            **run.trainer.parallel.summary(), **({"distributed": record} if (record := how_it_runs(run)) else {}),
            **({"conv_algorithms": run.network.conv_algorithms()} if run.network.conv_layers() else {}),
            **({"init_from": run.trainer.origin} if run.trainer.origin else {}), **final}


def one_class_note(report: dict[str, Any], config: Config) -> str | None:
    """A classifier that predicts one class for every training row, of several: what it learned is
    the majority class (a learning rate too large, too few epochs, rare classes), said, not left to MCC 0."""
    matrix, labels = report.get("confusion_matrix"), report.get("labels")
    if not matrix or not labels or sum(1 for row in matrix if sum(row) > 0) < 2:
        return None
    predicted = [sum(column) for column in zip(*matrix)]
    if sum(1 for n in predicted if n > 0) != 1:
        return None
    label = labels[next(i for i, n in enumerate(predicted) if n > 0)]
    weigh = "" if config.training.class_weight is not None else "training.class_weight: balanced, "
    return (f"the model predicts {str(label)!r} for every one of the {sum(predicted):,} training rows: the features "
            f"taught it nothing, or training did not get far. Try {weigh}more training.epochs, or a smaller "
            f"optimizer.learning_rate (now {config.optimizer.learning_rate:g})")


def _units(data: Prepared) -> str | None:
    """The final table's caption when the loss and the other metrics are in different units."""
    if not data.targets.active:
        return None
    return "loss: on the standardized target (data.target_normalize), as trained; mse, rmse, mae: in the target's units"


def how_it_runs(run: Run) -> dict[str, Any]:
    """How a run of 2+ ranks runs (metrics.json's `distributed`): the strategy used (what `auto` chose, or a
    fallback), the MPI library and its transport, and the ranks on each host; {} for one process."""
    if run.comm.size == 1:
        return {}
    return {"strategy": run.trainer.parallel.strategy_used(), "configured_strategy": run.config.distributed.strategy,
            **run.comm.placement()}


def in_words(record: dict[str, Any]) -> str:
    """`how_it_runs` as the run log and config.yaml's first line (a comment: the config itself keeps
    `auto`, which chooses again for the layout of each run) say it."""
    used, configured = record["strategy"], record["configured_strategy"]
    why = (" (auto chose it)" if configured == "auto" else
           "" if used.split()[0] == configured else f" (in place of {configured})")
    hosts = ", ".join(f"{host}: {n} rank{'s' * (n > 1)}" for host, n in record["ranks_per_host"].items())
    return f"strategy {used}{why}; ranks per host: {hosts}; {record['mpi_library']}; transport {record['mpi_transport']}"


def _resume(ckpt: Checkpoint, run: Run, reporter: Reporter) -> None:
    """Check the checkpoint against this run, restore it, and say where training goes on from."""
    trainer, config = run.trainer, run.config
    own = [c.name for c in run.data.encoder.columns if own_missing_category(c)]
    notes = check_compatible(ckpt, config, run.data.train, run.network.state_dict, own) + restore(ckpt, trainer)
    _refuse_ending_a_stopped_run(ckpt, trainer, config.training.epochs)
    notes += schedule_change(ckpt.meta["config"], config, trainer, len(run.data.train.x))
    pos, done = trainer.position, len(trainer.history.epochs)
    reporter.info(f"resuming from {ckpt.path}: epoch {pos.epoch}, step {pos.step} (global step {trainer.global_step})")
    for note in notes:
        reporter.warn(f"resumed with {note}" if ": checkpoint " in note else note)
    if trainer.history.stopped_early:
        reporter.warn(f"the run had already stopped early after epoch {done} (training.early_stopping); "
                      "nothing is left to train, so only its outputs are written again")
    elif pos.epoch > config.training.epochs:
        reporter.warn(f"the run had already finished its {done} epochs; raise training.epochs "
                      f"(e.g. --set training.epochs={done + 10}) to train on")


def _refuse_ending_a_stopped_run(ckpt: Checkpoint, trainer: Trainer, epochs: int) -> None:
    """A run stopped before the epochs it was set to, resumed with fewer epochs than it has run (its
    --set left out): refused, naming both counts, before anything is written."""
    planned = (ckpt.meta["config"].get("training") or {}).get("epochs")
    done = len(trainer.history.epochs)
    if isinstance(planned, int) and epochs < done < planned and not trainer.history.stopped_early:
        raise ConfigError(f"training.epochs: this config says {epochs}, but the run was set to {planned} epochs "
                          f"and stopped after epoch {done}: resumed so, it would end there. Continue it with "
                          f"--set training.epochs={planned} (as it was started), or end it at epoch {done} on purpose "
                          f"with --set training.epochs={done}")


def schedule_change(saved: dict[str, Any], config: Config, trainer: Trainer, rows: int) -> list[str]:
    """A resumed run follows the new config's schedule (its horizon may follow training.epochs):
    say so, with the learning rate the next step would have had and has now."""
    try:
        before = build_optimizer(Config.model_validate(saved), trainer.opt.steps_per_epoch, rows=rows)
    except Exception:  # noqa: BLE001  the checkpoint's config no longer validates: nothing to compare
        return []
    before.t = trainer.opt.t
    old, new = before.lr(), trainer.opt.lr()
    if math.isclose(old, new, rel_tol=1e-9, abs_tol=0.0):
        return []
    horizon = ""
    schedule = config.optimizer.schedule
    if schedule is not None and schedule.type == "cosine" and schedule.epochs is None:
        was = (saved["optimizer"].get("schedule") or {}).get("epochs") or saved["training"]["epochs"]
        horizon = (f"; the cosine schedule now decays over {config.training.epochs} epochs instead of {was} "
                   f"(keep the old horizon with --set optimizer.schedule.epochs={was})")
    return [f"the learning-rate schedule changed at global step {trainer.opt.t}: the next step's rate is "
            f"{new:.6g} (it was {old:.6g} under the checkpoint's config){horizon}"]


def write_outputs(out_dir: Path, config: Config, network: Any, weights: dict[str, Any], data: Prepared, task: str,
                  metrics: dict[str, Any], history: History) -> None:
    """The run's final files; where one cannot be written (a full disk), the model and metrics.json
    written before it are removed: no model is left without the files that describe it."""
    folder = RunFolder(out_dir)
    try:
        save_model(folder.model, network, config, data, task,
                   {k: v for k, v in metrics.items() if not isinstance(v, dict)}, weights)
        write_json(folder.metrics, metrics)
        write_text(folder.history, history.csv())
        write_config(out_dir, config, metrics)
    except BaseException:
        for path in (folder.model, folder.metrics):
            path.unlink(missing_ok=True)
        raise


def write_config(out_dir: Path, config: Config, record: dict[str, Any]) -> None:
    """The resolved config (seed drawn, paths absolute), which trains again from any directory; its
    first lines say how the run ran (`record`'s distributed layout) and the --init-from it needs."""
    header = f"# trained with {in_words(record['distributed'])}\n" if record.get("distributed") else ""
    if origin := record.get("init_from"):
        header += f"# started from the weights of {origin['path']}: train again with --init-from {shlex.quote(origin['path'])}\n"
    write_text(RunFolder(out_dir).config, header + yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))

