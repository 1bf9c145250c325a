"""`magmadnn train`: config -> data -> network -> fit -> evaluate -> run directory."""

from __future__ import annotations

import csv
import io
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..core import backend as B
from ..data.augment import augment
from ..training.builder import build_network, build_optimizer, check_output_width, task_of
from ..training.checkpoint import Checkpoint, Saver, check_compatible, clear, load_for_resume, restore
from ..config.schema import Config
from ..data.tables import Prepared, Split, prepare
from ..distributed import Communicator, SingleProcess
from ..errors import MagmaError
from ..files import write_json, write_text
from ..training.metrics import classification_report, predicted_classes, regression_report
from ..training.modelfile import load as load_model
from ..training.modelfile import save as save_model
from ..reporting import Reporter, metrics_table
from ..training.trainer import EarlyStopper, History, Trainer, steps_per_epoch


@dataclass
class RunResult:
    out_dir: Path
    metrics: dict[str, Any]
    history: History


def split_report(trainer: Trainer, split: Split, classes: list[Any], task: str) -> dict[str, Any]:
    """Loss plus the full metric set of one split."""
    result = trainer.evaluate(split)
    outputs = result.pop("outputs")
    if task == "regression":
        result.update(regression_report(split.y, outputs))
    else:
        truth = split.y.reshape(-1).astype(np.int64)
        result.update(classification_report(truth, predicted_classes(outputs, task), classes))
    return result


def train(config: Config, out_dir: Path | None = None, init_from: Path | None = None, reporter: Reporter | None = None,
          comm: Communicator | None = None, prune: Any = None, resume: Path | None = None,
          checkpoints: bool = True) -> RunResult:
    """`out_dir` defaults to runs/<name>, or to the run that `resume` (a checkpoint or run dir) names."""
    comm = comm or SingleProcess()
    reporter = reporter or Reporter()
    started = time.perf_counter()
    if init_from is not None and resume is not None:
        raise MagmaError("--resume continues a training (weights, optimizer, position); --init-from starts a "
                         "new one from a model's weights: give one of them")
    ckpt = load_for_resume(resume, comm) if resume is not None else None
    if config.seed is None:  # drawn once for all ranks, or the resumed run's
        seed = ckpt.meta["config"].get("seed") if ckpt else comm.bcast(secrets.randbelow(2**31))
        config = config.model_copy(update={"seed": seed})
    if out_dir is None:
        out_dir = ckpt.path.parent.parent if ckpt else Path("runs") / config.name
    device = B.select(config.device, config.precision, config.memory)
    if device == "gpu":
        B.use_gpu_device(comm.local_rank)
    task = task_of(config)
    data = prepare(config.data, task, config.seed)
    network = build_network(config, data.sample_shape)
    check_output_width(config, network, data.classes, data.source)
    if init_from is not None:
        saved = load_model(init_from)
        try:
            network.load_state(saved.weights)
        except MagmaError as exc:
            raise MagmaError(f"--init-from {init_from}: {exc}") from exc
    optimizer = build_optimizer(config, steps_per_epoch(len(data.train.x), config.training.batch_size))
    comm.share(network, optimizer)  # every rank starts from rank 0's weights
    aug = config.training.augment
    if aug is not None and len(data.sample_shape) != 3:
        raise MagmaError(f"training.augment is for (channels, height, width) images; the samples have shape "
                         f"{data.sample_shape} (set data.shape)")
    batch = min(config.training.batch_size, len(data.train.x))
    B.require_memory(network.training_bytes(batch, len(optimizer.slots)),
                     f"training with batch {batch} (training.batch_size; weights, gradients, optimizer state, activations)")
    policy = config.training.checkpoint if checkpoints else None
    saver = Saver(out_dir / "checkpoints", policy, config, data.train, comm) if policy else None
    trainer = Trainer(network, optimizer, task, config.training.batch_size, config.seed,
                      config.training.shuffle, comm, reporter, config.training.eval_batch_size,
                      (lambda xb, rng: augment(xb, rng, aug.crop_padding, aug.horizontal_flip)) if aug else None,
                      saver, stop_on_signal=bool(policy and policy.on_signal))
    es = config.training.early_stopping
    stopper = EarlyStopper(es.monitor, es.patience, es.min_delta, es.restore_best) if es else None
    if stopper and stopper.monitor.startswith("val_") and data.validation is None:
        raise MagmaError(f"training.early_stopping.monitor: {stopper.monitor} needs validation data "
                         "(data.validation_split > 0 or data.validation)")
    reporter.info(f"[bold]{config.name}[/]: {len(data.train.x)} training rows, {network.num_parameters:,} "
                  f"parameters, device {device}, {comm.size} process(es), seed {config.seed}")
    if ckpt is not None:
        _resume(ckpt, trainer, stopper, config, data.train, saver, reporter)
    elif saver is not None and comm.is_root and (removed := clear(saver.folder)):
        reporter.info(f"removed {removed} checkpoint(s) of an earlier run in {saver.folder}")
    history = trainer.fit(data.train, data.validation, config.training.epochs, stopper, prune=prune)
    trainer.check_weights()
    final = {name: split_report(trainer, split, data.classes, task)
             for name, split in (("train", data.train), ("validation", data.validation), ("test", data.test))
             if split is not None}
    metrics = {"name": config.name, "task": task, "device": device, "processes": comm.size,
               "epochs_run": len(history.epochs), "stopped_early": history.stopped_early, "pruned": history.pruned,
               "best_epoch": history.best_epoch, "wall_time_s": round(time.perf_counter() - started, 3),
               "parameters": network.num_parameters, **final}
    if comm.is_root:
        write_outputs(out_dir, config, network, data, task, metrics, history)
        reporter.table(metrics_table(f"{config.name} — final metrics", final))
        reporter.info(f"wrote {out_dir}/model.npz, metrics.json, metrics.csv, config.yaml"
                      + (", checkpoints/" if saver is not None else ""))
    comm.barrier()
    return RunResult(out_dir, metrics, history)


def _resume(ckpt: Checkpoint, trainer: Trainer, stopper: EarlyStopper | None, config: Config, train: Split,
            saver: Saver | None, reporter: Reporter) -> None:
    """Check the checkpoint against this run, restore it, and say where training goes on from."""
    notes = check_compatible(ckpt, config, train) + restore(ckpt, trainer, stopper)
    if saver is not None:
        saver.last = ckpt.path
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


def write_outputs(out_dir: Path, config: Config, network: Any, data: Prepared, task: str,
                  metrics: dict[str, Any], history: History) -> None:
    save_model(out_dir / "model.npz", network, config, data.normalizer, data.classes, data.features, task,
               {k: v for k, v in metrics.items() if not isinstance(v, dict)})
    write_json(out_dir / "metrics.json", metrics)
    write_text(out_dir / "metrics.csv", history_csv(history))
    write_text(out_dir / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def history_csv(history: History) -> str:
    columns = list(dict.fromkeys(k for row in history.epochs for k in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns or ["epoch"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(history.epochs)
    return text.getvalue()
