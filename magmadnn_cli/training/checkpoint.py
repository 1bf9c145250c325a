"""Checkpoints: everything needed to continue a training exactly where it stopped.

One `.npz` per checkpoint in `<run dir>/checkpoints/step<global step>.npz`, loaded with
`allow_pickle=False`, written atomically (temp file, fsync, rename); the newest `keep` are kept.

Keys:
  format            "magmadnn-checkpoint"        format_version   1
  meta              JSON: position (epoch in progress, steps of it done, its running sums), global
                    step, history, early-stopping state, dropout RNG state of every rank, rank count,
                    config, data fingerprint, magmadnn version
  params            the flat parameter buffer
  buffers/<name>    non-trainable state (batchnorm running statistics)
  optimizer/<slot>  the optimizer's flat state (momentum, Adam moments, ...)
  best_params       early stopping's best weights (when restore_best)
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..core import backend as B
from ..config.schema import Checkpointing, Config
from ..data.tables import Split
from ..distributed import Communicator
from ..errors import MagmaError
from ..files import atomic_write, load_npz
from .trainer import EarlyStopper, History, Position, Trainer

FORMAT = "magmadnn-checkpoint"
FORMAT_VERSION = 1
NAME = re.compile(r"^step(\d+)\.npz$")

# Config fields a resumed run must share with the checkpoint (anything else may change, e.g. epochs).
MUST_MATCH = ("model", "loss", "seed", "precision", "optimizer.type", "training.batch_size",
              "training.shuffle", "training.augment")


REQUIRED = ("position", "global_step", "history", "early_stopping", "rng", "ranks", "config", "data")


@dataclass
class Checkpoint:
    path: Path
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]


def fingerprint(train: Split) -> str:
    """sha256 of the prepared (split, normalized) training arrays: same data, same fingerprint."""
    digest = hashlib.sha256()
    for a in (train.x, train.y):
        digest.update(str((a.dtype.str, a.shape)).encode())
        digest.update(np.ascontiguousarray(a).data)
    return digest.hexdigest()


# -- RNG state ---------------------------------------------------------------------------------
def rng_state(rng: Any) -> dict[str, Any]:
    """A JSON-able copy of a numpy or cupy generator's state ({} when it cannot be read)."""
    bits = getattr(rng, "bit_generator", None)
    if isinstance(getattr(bits, "state", None), dict):
        return {"numpy": bits.state}
    try:  # cupy keeps its curand states in a device array
        return {"device": base64.b64encode(B.to_host(bits._state).tobytes()).decode("ascii")}
    except Exception:  # another cupy layout: resume then reseeds (and says so)
        return {}


def set_rng_state(rng: Any, state: dict[str, Any]) -> bool:
    """Restore `state` into `rng`; False when this kind of generator cannot take it."""
    bits = getattr(rng, "bit_generator", None)
    if "numpy" in state and isinstance(getattr(bits, "state", None), dict):
        bits.state = state["numpy"]
        return True
    if "device" in state:
        try:
            raw = bits._state
            host = np.frombuffer(base64.b64decode(state["device"]), dtype=B.to_host(raw).dtype)
            if host.size == raw.size:
                raw[...] = B.to_device(host.reshape(raw.shape))
                return True
        except Exception:  # another cupy layout
            return False
    return False


# -- writing -----------------------------------------------------------------------------------
class Saver:
    """Writes checkpoints of a trainer when due (the Trainer's `Checkpointer`)."""

    def __init__(self, folder: Path, policy: Checkpointing, config: Config, train: Split,
                 comm: Communicator) -> None:
        self.folder, self.policy, self.config, self.comm = Path(folder), policy, config, comm
        self.data = fingerprint(train)
        self.last: Path | None = None

    def due(self, global_step: int, epoch_done: int | None) -> bool:
        """After a step: every `every_steps`. After an epoch: every `every_epochs`, or when the
        epoch's last step was a step checkpoint (written here, after the epoch's evaluation)."""
        p = self.policy
        if p.every_steps and global_step % p.every_steps == 0:
            return True
        return epoch_done is not None and bool(p.every_epochs) and epoch_done % p.every_epochs == 0

    def write(self, trainer: Trainer) -> Path:
        rng_states = self.comm.allgather(rng_state(trainer.net.rng))  # a collective: every rank joins
        path = self.folder / f"step{trainer.global_step:08d}.npz"
        if self.comm.is_root:
            buffer = io.BytesIO()
            np.savez(buffer, **snapshot(trainer, self.config, self.data, rng_states))
            atomic_write(path, lambda f: f.write(buffer.getvalue()))
            prune(self.folder, self.policy.keep)
        self.last = path
        return path


def snapshot(trainer: Trainer, config: Config, data: str, rng_states: list[dict]) -> dict[str, np.ndarray]:
    opt, stopper = trainer.opt, trainer.stopper
    meta = {"position": asdict(trainer.position), "global_step": trainer.global_step,
            "history": asdict(trainer.history), "ranks": trainer.comm.size, "rng": rng_states,
            "early_stopping": None if stopper is None else
            {"best": stopper.best, "best_epoch": stopper.best_epoch, "wait": stopper.wait},
            "config": config.model_dump(mode="json"), "data": data, "magmadnn_version": __version__}
    arrays = {"format": np.array(FORMAT), "format_version": np.array(FORMAT_VERSION),
              "meta": np.array(json.dumps(meta)), "params": B.to_host(trainer.net.flat_params)}
    arrays.update({f"buffers/{k}": B.to_host(v) for k, v in trainer.net.buffers().items()})
    if opt is not None:
        arrays.update({f"optimizer/{k}": B.to_host(v) for k, v in opt.state.items()})
    if stopper is not None and stopper.best_params is not None:
        arrays["best_params"] = B.to_host(stopper.best_params)
    return arrays


def listing(folder: Path) -> list[Path]:
    """The checkpoints in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def prune(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, and temp files a killed writer left."""
    for old in listing(folder)[:-keep]:
        old.unlink(missing_ok=True)
    for stale in folder.glob(".step*.npz.*.tmp"):
        stale.unlink(missing_ok=True)


def clear(folder: Path) -> int:
    """A fresh (not resumed) run starts without an earlier run's checkpoints; returns how many went."""
    old = listing(folder)
    for p in old:
        p.unlink(missing_ok=True)
    return len(old)


# -- reading -----------------------------------------------------------------------------------
def locate(path: Path) -> Path:
    """`path` is a checkpoint, a run directory, or its checkpoints folder: the checkpoint to use."""
    path = Path(path)
    if not path.exists():
        raise MagmaError(f"--resume {path}: no such file or directory")
    if path.is_file():
        return path
    for folder in (path / "checkpoints", path):
        found = listing(folder)
        if found:
            return found[-1]
    raise MagmaError(f"--resume {path}: no checkpoints in {path / 'checkpoints'} (they are written when "
                     "training.checkpoint is on, the default, after every epoch)")


def read(path: Path) -> Checkpoint:
    arrays = load_npz(path, "magmadnn checkpoint")
    if str(arrays.get("format", "")) != FORMAT:
        kind = "a model file; --init-from takes weights only" if any(k.startswith("weights/") for k in arrays) \
            else "not a magmadnn checkpoint"
        raise MagmaError(f"{path}: {kind}")
    try:
        if int(arrays.pop("format_version")) > FORMAT_VERSION:
            raise MagmaError(f"{path}: this checkpoint's format is newer than this magmadnn understands; "
                             "upgrade magmadnn")
        meta = json.loads(str(arrays.pop("meta")))
    except (KeyError, TypeError, ValueError) as exc:
        raise MagmaError(f"{path}: corrupt checkpoint ({type(exc).__name__}: {exc})") from exc
    arrays.pop("format")
    missing = [k for k in REQUIRED if k not in (meta if isinstance(meta, dict) else {})]
    if not missing and not isinstance(meta["config"], dict):
        missing = ["a config"]
    if missing or "params" not in arrays:
        raise MagmaError(f"{path}: corrupt checkpoint (it lacks {', '.join(missing or ['params'])})")
    return Checkpoint(path, meta, arrays)


def load_for_resume(path: Path, comm: Communicator) -> Checkpoint:
    """Rank 0 finds and reads the checkpoint, every rank gets it (node-local disks are fine)."""
    ckpt = read(locate(path)) if comm.is_root else None
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


def check_compatible(ckpt: Checkpoint, config: Config, train: Split) -> list[str]:
    """Refuse a checkpoint of another architecture, data set or batch; return notes on what changed
    harmlessly (e.g. epochs, learning rate)."""
    saved, current = ckpt.meta["config"], config.model_dump(mode="json")
    problems = differences(saved, current, MUST_MATCH)
    if ckpt.meta["data"] != fingerprint(train):
        problems.append("the training data (after data.* splitting and normalization) differs from the "
                        "checkpoint's")
    if problems:
        raise MagmaError(f"--resume {ckpt.path}: the config does not match the checkpoint, so training "
                         "cannot continue exactly:\n  " + "\n  ".join(problems) +
                         "\nUse --init-from MODEL.npz to start a new training from saved weights instead.")
    ignore = ("name", "training.epochs", "training.checkpoint", "distributed", "data", "device", "memory")
    return [d for d in differences(saved, current, None) if not any(d.startswith(i) for i in ignore)]


def restore(ckpt: Checkpoint, trainer: Trainer, stopper: EarlyStopper | None) -> list[str]:
    """Put the checkpoint's state into the trainer; returns notes (e.g. dropout reseeded)."""
    try:
        return _restore(ckpt, trainer, stopper)
    except (KeyError, TypeError, ValueError, IndexError) as exc:  # fields of the wrong kind or shape
        raise MagmaError(f"{ckpt.path}: corrupt checkpoint ({type(exc).__name__}: {exc})") from exc


def _restore(ckpt: Checkpoint, trainer: Trainer, stopper: EarlyStopper | None) -> list[str]:
    meta, arrays, net, opt = ckpt.meta, ckpt.arrays, trainer.net, trainer.opt
    params = arrays["params"]
    if params.shape != net.flat_params.shape:
        raise MagmaError(f"{ckpt.path}: {params.size} parameters; this network has {net.flat_params.size}")
    net.flat_params[...] = B.to_device(params, dtype=net.flat_params.dtype)
    for name, buffer in net.buffers().items():
        buffer[...] = B.to_device(arrays[f"buffers/{name}"], dtype=buffer.dtype)
    assert opt is not None
    opt.t = int(meta["global_step"])
    for key, value in arrays.items():
        if key.startswith("optimizer/"):  # in place: the state may live in memory shared by ranks
            name = key.removeprefix("optimizer/")
            if name in opt.state:
                opt.state[name][...] = B.to_device(value, dtype=net.flat_params.dtype)
            else:
                opt.state[name] = B.to_device(value, dtype=net.flat_params.dtype)
    trainer.position = Position(**meta["position"])
    trainer.history = History(**meta["history"])
    if stopper is not None and meta["early_stopping"] is not None:
        es = meta["early_stopping"]
        stopper.best, stopper.best_epoch, stopper.wait = float(es["best"]), int(es["best_epoch"]), int(es["wait"])
        if "best_params" in arrays:
            stopper.best_params = B.to_device(arrays["best_params"], dtype=net.flat_params.dtype)
    notes = []
    rank, ranks = trainer.comm.rank, trainer.comm.size
    same_ranks = meta["ranks"] == ranks
    if not (same_ranks and set_rng_state(net.rng, meta["rng"][rank])):
        seed = int(np.random.SeedSequence([trainer.seed, meta["global_step"], rank]).generate_state(1)[0])
        set_rng_state(net.rng, rng_state(B.rng(seed)))  # in place: the dropout ops hold this generator
        why = "this generator's state could not be restored" if same_ranks else \
            f"the checkpoint was written by {meta['ranks']} rank(s), this run has {ranks}"
        notes.append(f"{why}: dropout draws are reseeded, so results match an uninterrupted run only "
                     "statistically")
    return notes
