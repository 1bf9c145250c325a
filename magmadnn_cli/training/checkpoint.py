"""Checkpoints: everything needed to continue a training exactly where it stopped.

One `.npz` per checkpoint in `<run dir>/checkpoints/step<global step>.npz`, loaded with
`allow_pickle=False`, written atomically (temp file, fsync, rename); the newest `keep` are kept.

This module only serializes: every stateful object (trainer position and history, network weights
and buffers, optimizer step, slots and scalars, early stopping's best state) gives its
`state_dict()` and takes it back with `load_state_dict()`. A new layer buffer or optimizer scalar
is checkpointed with no change here. Random numbers need no state: they are counter-based, keyed by
(seed, epoch, sample position).

Keys:
  format            "magmadnn-checkpoint"        format_version   2
  meta              JSON: each owner's non-array state ({"trainer": {...}, "optimizer": {"step": ...}}),
                    global step, rank count, config, data fingerprint, magmadnn version
  <owner>/<key>     each owner's arrays, e.g. network/dense_0/kernel, optimizer/slots/m,
                    early_stopping/best_state/batchnorm_1/running_mean
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import __version__
from ..config.schema import Checkpointing, Config
from ..data.prepare import Split
from ..data.stream_prepare import InOrder
from ..distributed import Communicator
from ..errors import MagmaError, ShapeError
from ..files import atomic_write, file_sha256, load_npz, write_text
from .run_folder import RunFolder, checkpoint_files
from .trainer import Trainer

FORMAT = "magmadnn-checkpoint"
FORMAT_VERSION = 3  # 3: the history's epochs as JSON lines (trainer/history_epochs); 2 is read too
READABLE_FROM = 2

# Config fields a resumed run must share with the checkpoint (anything else may change, e.g. epochs).
MUST_MATCH = ("model", "loss", "seed", "precision", "optimizer.type", "training.batch_size",
              "training.batch_schedule", "training.shuffle", "training.augment")


REQUIRED = ("state", "global_step", "ranks", "config", "data")
OWNERS = ("trainer", "network", "optimizer")


@dataclass
class Checkpoint:
    path: Path
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]


def rows_digest(train: Split) -> str:
    """sha256 of the prepared (split, normalized) training arrays: same data, same digest. A streamed
    split's rows are never held: its blocks' bounds and row counts, the normalizer fitted on all its
    rows (exact moments) and its targets stand in for them."""
    digest = hashlib.sha256()
    arrays = (train.x, train.y)
    if isinstance(train.x, InOrder):
        source = train.x.source
        bounds = np.array([(b.lo, b.hi, b.first_row, b.rows) for b in source.blocks], np.int64)
        arrays = (bounds, source.normalizer.shift, source.normalizer.spread, np.asarray(train.y))
    for a in arrays:
        digest.update(str((a.dtype.str, a.shape)).encode())
        digest.update(np.ascontiguousarray(a).data)
    return digest.hexdigest()


# -- state dicts <-> arrays + JSON ----------------------------------------------------------------
def pack(owners: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Split each owner's state into JSON-able values and arrays (stored as `<owner>/<key>`)."""
    scalars: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for owner, state in owners.items():
        scalars[owner] = {}
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                arrays[f"{owner}/{key}"] = value
            else:
                scalars[owner][key] = value
    return scalars, arrays


def unpack(scalars: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    owners: dict[str, dict[str, Any]] = {owner: dict(values) for owner, values in scalars.items()}
    for key, value in arrays.items():
        owner, _, rest = key.partition("/")
        owners.setdefault(owner, {})[rest] = value
    return owners


# -- writing -----------------------------------------------------------------------------------
class Saver:
    """Writes checkpoints of a trainer when due (the Trainer's `Checkpointer`)."""

    def __init__(self, run: RunFolder, policy: Checkpointing, config: Config, train: Split,
                 comm: Communicator) -> None:
        self.folder, self.policy, self.config, self.comm = run.checkpoints, policy, config, comm
        self.history = run.history  # the epochs so far, beside each checkpoint: to follow, or after a kill
        self.data = rows_digest(train)
        self.last: Path | None = None

    def due(self, global_step: int, epoch_done: int | None) -> bool:
        """After a step: every `every_steps`. After an epoch: every `every_epochs`, or when the
        epoch's last step was a step checkpoint (written here, after the epoch's evaluation)."""
        p = self.policy
        if p.every_steps and global_step % p.every_steps == 0:
            return True
        return epoch_done is not None and bool(p.every_epochs) and epoch_done % p.every_epochs == 0

    def write(self, trainer: Trainer) -> Path:
        path = self.folder / RunFolder.CHECKPOINT_FILE.format(trainer.global_step)
        arrays = snapshot(trainer, self.config, self.data)  # on every rank: split layers are gathered whole
        if self.comm.is_root:
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            atomic_write(path, lambda f: f.write(buffer.getvalue()))
            prune(self.folder, self.policy.keep)
            write_text(self.history, trainer.history.csv())
        self.last = path
        return path

    def resumed(self, path: Path) -> None:
        """The run goes on from `path`: the last checkpoint until this run writes one."""
        self.last = path

    def newest(self) -> Path | None:
        """The checkpoint --resume would take: the newest on disk, where a signal landed between a
        write's rename and `last`; `last` where this rank sees no checkpoints (another host's root)."""
        found = checkpoint_files(self.folder)
        return found[-1] if found else self.last


def snapshot(trainer: Trainer, config: Config, data: str) -> dict[str, np.ndarray]:
    scalars, arrays = pack(trainer.state_dicts())
    meta = {"state": scalars, "global_step": trainer.global_step, "ranks": trainer.comm.size,
            "config": config.model_dump(mode="json"), "data": data, "magmadnn_version": __version__}
    return {"format": np.array(FORMAT), "format_version": np.array(FORMAT_VERSION),
            "meta": np.array(json.dumps(meta)), **arrays}


def prune(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, and temp files a killed writer left."""
    for old in checkpoint_files(folder)[:-keep]:
        old.unlink(missing_ok=True)
    for stale in folder.glob(RunFolder.CHECKPOINT_TEMP):
        stale.unlink(missing_ok=True)


def clear(folder: Path) -> int:
    """A fresh (not resumed) run starts without an earlier run's checkpoints; returns how many went."""
    old = checkpoint_files(folder)
    for p in old:
        p.unlink(missing_ok=True)
    return len(old)


# -- reading -----------------------------------------------------------------------------------
def read(path: Path) -> Checkpoint:
    arrays = load_npz(path, "magmadnn checkpoint")
    if str(arrays.get("format", "")) != FORMAT:
        kind = "a model file; --init-from takes weights only" if any(k.startswith("weights/") for k in arrays) \
            else "not a magmadnn checkpoint"
        raise MagmaError(f"{path}: {kind}")
    try:
        version = int(arrays.pop("format_version"))
        if version > FORMAT_VERSION:
            raise MagmaError(f"{path}: this checkpoint's format is newer than this magmadnn understands; "
                             "upgrade magmadnn")
        if version < READABLE_FROM:
            raise MagmaError(f"{path}: a checkpoint of an older magmadnn (format {version}), which cannot be "
                             "resumed exactly by this one; start a new training from the run's weights with "
                             "--init-from RUN_DIR/model.npz")
        meta = json.loads(str(arrays.pop("meta")))
    except (KeyError, TypeError, ValueError) as exc:
        raise MagmaError(f"{path}: corrupt checkpoint ({type(exc).__name__}: {exc})") from exc
    arrays.pop("format")
    missing = [k for k in REQUIRED if k not in (meta if isinstance(meta, dict) else {})]
    if not missing and not isinstance(meta["config"], dict):
        missing = ["a config"]
    if not missing and not isinstance(meta["state"], dict):
        missing = ["its state"]
    if not missing:
        missing = [f"the {owner} state" for owner in OWNERS if owner not in meta["state"]]
    if missing:
        raise MagmaError(f"{path}: corrupt checkpoint (it lacks {', '.join(missing)})")
    return Checkpoint(path, meta, arrays)


def starting_weights(path: Path) -> dict[str, np.ndarray]:
    """--init-from's weights: a model file's, or the network's of a checkpoint (`RunFolder.starting_file`)."""
    from .modelfile import load  # only for --init-from
    path = RunFolder.starting_file(path)
    if path.is_file() and str(load_npz(path, "model file or checkpoint", keys=("format",)).get("format")) == FORMAT:
        ckpt = read(path)
        return unpack(ckpt.meta["state"], ckpt.arrays)["network"]
    return load(path).weights


def weights_origin(init_from: Path) -> dict[str, str]:
    """What --init-from reads (metrics.json's `init_from`): the file's absolute path and sha256."""
    path = RunFolder.starting_file(init_from).resolve()
    return {"path": str(path), "sha256": file_sha256(path) or ""}


def load_for_resume(path: Path, comm: Communicator) -> Checkpoint:
    """Rank 0 finds and reads the checkpoint, every rank gets it (node-local disks are fine)."""
    ckpt = read(RunFolder.to_resume(path)) if comm.is_root else None
    return comm.bcast(ckpt)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flatten(sub, f"{prefix}{key}.").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in _flatten(sub, f"{prefix}{i}.").items()} \
            or {prefix.rstrip("."): []}
    return {prefix.rstrip("."): tree}


def differences(saved: dict[str, Any], current: dict[str, Any], fields: tuple[str, ...] | None,
                saved_as: str = "checkpoint") -> list[str]:
    """`field: checkpoint X, config Y` for each leaf that differs (within `fields`, if given)."""
    old, new = _flatten(saved), _flatten(current)
    keys = sorted(set(old) | set(new))
    if fields is not None:
        keys = [k for k in keys if any(k == f or k.startswith(f + ".") for f in fields)]
    missing = "(absent)"
    return [f"{k}: {saved_as} {old.get(k, missing)!r}, config {new.get(k, missing)!r}"
            for k in keys if old.get(k, missing) != new.get(k, missing)]


def check_config_matches(ckpt: Checkpoint, config: Config) -> None:
    """Refuse a checkpoint of another architecture or batch (before the data are read: said alone)."""
    _refuse(ckpt, differences(ckpt.meta["config"], config.model_dump(mode="json"), MUST_MATCH))


SHAPE_NEUTRAL = ("activation", "rate", "alpha", "momentum", "epsilon", "kernel_initializer", "bias_initializer",
                 "conv_algorithm", "mode")  # layer settings that leave the weights' shapes as they are


def _refuse(ckpt: Checkpoint, problems: list[str], misfits: list[str] | None = None) -> None:
    """The differences, and the way on: --init-from where the weights still fit the network, else a
    new training. `misfits`: the weights whose shapes differ from the built network's, where it is
    built; before, a difference in a model setting that shapes weights."""
    if not problems:
        return
    if misfits is None:
        misfits = [p.split(":")[0] for p in problems if p.startswith("model.")
                   and p.split(":")[0].rsplit(".", 1)[-1] not in SHAPE_NEUTRAL]
    way = (f"its weights do not fit this network ({', '.join(misfits[:3])}); train anew (another --out, or "
           "--overwrite)" if misfits else f"to start a new training from its weights instead: --init-from {ckpt.path}")
    raise MagmaError(f"--resume {ckpt.path}: the config does not match the checkpoint, so training cannot continue "
                     "exactly:\n  " + "\n  ".join(problems) + f"\n{way[0].upper()}{way[1:]}")


def misfit_weights(ckpt: Checkpoint, network: dict[str, Any]) -> list[str]:
    """The network's weights (`state_dict()`) that the checkpoint lacks or holds in another shape."""
    saved = unpack(ckpt.meta["state"], ckpt.arrays).get("network", {})
    return [name for name, value in network.items()
            if name not in saved or np.shape(saved[name]) != np.shape(value)]


def check_compatible(ckpt: Checkpoint, config: Config, train: Split, network: Callable[[], dict[str, Any]],
                     own_missing: list[str] = ()) -> list[str]:
    """Refuse a checkpoint of another architecture, data set or batch (`network()`: the built network's
    state, to say whether --init-from fits; `own_missing`: the category columns whose missing cells
    are a category of their own, which magmadnn filled with the most frequent value before);
    return notes on what changed harmlessly (epochs, learning rate)."""
    saved, current = ckpt.meta["config"], config.model_dump(mode="json")
    problems = differences(saved, current, MUST_MATCH)
    if ckpt.meta["data"] != rows_digest(train):
        earlier = "; ".join(f"--set 'data.columns.{name}={{type: category, missing: most_frequent}}'"
                            for name in own_missing[:8])
        problems.append("the training data (after data.* splitting and normalization) differs from the "
                        "checkpoint's" + (f" (if the file is unchanged: missing cells of a category column are now "
                                          f"a category of their own, where magmadnn filled them with the most frequent "
                                          f"value before; continue a run checkpointed then with {earlier})"
                                          if own_missing else ""))
    _refuse(ckpt, problems, misfit_weights(ckpt, network()) if problems else [])
    ignore = ("name", "training.epochs", "training.checkpoint", "distributed", "data", "device", "memory")
    return [d for d in differences(saved, current, None) if not any(d.startswith(i) for i in ignore)]


def restore(ckpt: Checkpoint, trainer: Trainer) -> list[str]:
    """Put the checkpoint's state into the trainer and the objects it trains; returns notes."""
    try:
        trainer.load_state_dicts(unpack(ckpt.meta["state"], ckpt.arrays))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ShapeError) as exc:
        raise MagmaError(f"{ckpt.path}: corrupt checkpoint, or one of another network "
                         f"({type(exc).__name__}: {exc})") from exc
    if trainer.checkpointer is not None:
        trainer.checkpointer.resumed(ckpt.path)
    ranks, now = ckpt.meta["ranks"], trainer.comm.size
    if ranks != now and trainer.parallel.exact:
        return [f"the checkpoint was written by {ranks} rank(s), this run has {now}: training continues "
                "as it would have (to float rounding), since every rank computes what one process does"]
    if not trainer.parallel.exact:
        counts = f"the checkpoint was written by {ranks} rank(s), this run has {now}: " if ranks != now else ""
        return [f"{counts}training continues from the checkpoint's state; asynchronous SGD's late gradients "
                "depend on timing, so not along the path an uninterrupted run takes"]
    return []
