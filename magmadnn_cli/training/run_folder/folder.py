"""`RunFolder`: the one answer to "where does a run's X live". It names every file of a run, a
cross-validation and a search (each name is written here once; every module asks it), tells what a
folder holds, chooses the folder a command writes, and resolves what a command is given (a model
file, a run folder, its checkpoints) to the file it reads.

A folder a command writes holds a marker, `.magmadnn` (JSON: what wrote it), and, while a command
writes it, a lock, `.magmadnn.lock` (`lock`). Re-running a config writes a new version of its default
folder (runs/NAME, runs/NAME-2, ... as Ludwig's experiment_run_N); an explicit `--out` holding an
earlier run is refused unless `--overwrite` (`replacing`); a folder holding anything else (the user's
own files) is refused always. The same rule holds for `train`, `train --folds` and `tune` (whose
default folder is runs/NAME-tune). Files other commands write beside a run (export's model.onnx,
plot's images) are recorded by their content's sha256 in `.magmadnn-made`, so that a later run
replaces or removes those only: never a file a person put there, or changed since.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import sys
from pathlib import Path
from typing import Literal

from ...errors import MagmaError, ModelFileError
from ...files import file_sha256, json_object, write_json
from .holder import live_holder

Kind = Literal["run", "search"]
LAYOUT = ("--processes", "-n", "--hostfile", "--hosts")  # the options that place a run's ranks


def _file(name: str) -> property:
    """A `RunFolder` property: the path of the file `name` in the folder."""
    return property(lambda folder: folder.path / name, doc=f"the folder's {name}")


class RunFolder:
    """A run's (or a search's, or a cross-validation's) folder and the path of each of its files."""

    MODEL = "model.npz"  # the trained model (a search's: its best trial's)
    METRICS = "metrics.json"  # final metrics, written last (a cross-validation's: per fold, mean, std)
    HISTORY = "metrics.csv"  # one row per epoch (a cross-validation's: per fold)
    CONFIG = "config.yaml"  # the resolved config, written as the run starts
    CHECKPOINTS = "checkpoints"  # step<global step>.npz, the newest `keep`
    ONNX = "model.onnx"  # `magmadnn export`'s default output
    TENSORBOARD = "tensorboard"  # tracking.tensorboard: true
    MLFLOW = "mlflow_run.json"  # the MLflow run a resumed run continues
    JOURNAL = "trials.jsonl"  # a search's journal (tune --resume reads it)
    TRIALS_TABLE = "trials.csv"
    BEST_CONFIG = "best_config.yaml"
    TRIALS = "trials"  # trials/<index>: each trial's run folder
    MARKER = ".magmadnn"  # what wrote the folder (JSON: kind, magmadnn version, a cross-validation's folds)
    LOCK = ".magmadnn.lock"  # held while a command writes it (`holder`)
    STASH = ".magmadnn-replaced"  # an earlier run that an --overwrite run set aside (`replacing`)
    LEDGER = ".magmadnn-made"  # the files other commands wrote beside the run, by sha256
    CHECKPOINT_FILE = "step{:08d}.npz"
    CHECKPOINT_NAME = r"^step(\d+)\.npz$"
    CHECKPOINT_TEMP = ".step*.npz.*.tmp"  # what a killed checkpoint writer leaves

    # each file's path in this folder: `folder.model` is `folder.path / RunFolder.MODEL`
    model = _file(MODEL)
    metrics = _file(METRICS)
    history = _file(HISTORY)
    config = _file(CONFIG)
    checkpoints = _file(CHECKPOINTS)
    onnx = _file(ONNX)
    tensorboard = _file(TENSORBOARD)
    mlflow = _file(MLFLOW)
    journal = _file(JOURNAL)
    trials_table = _file(TRIALS_TABLE)
    best_config = _file(BEST_CONFIG)
    trials = _file(TRIALS)
    marker = _file(MARKER)
    lock = _file(LOCK)
    stash = _file(STASH)
    ledger = _file(LEDGER)

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @classmethod
    def holding(cls, checkpoint: Path) -> "RunFolder":
        """The run folder a checkpoint file of its checkpoints/ belongs to."""
        return cls(Path(checkpoint).parent.parent)

    def trial(self, index: int) -> "RunFolder":
        return RunFolder(self.path / self.TRIALS / str(index))

    def retrained(self) -> "RunFolder":
        """A cross-validated trial's model, trained once on its config for the search's model.npz."""
        return RunFolder(self.path / "model")

    def checkpoint(self, step: int) -> Path:
        return self.path / self.CHECKPOINTS / self.CHECKPOINT_FILE.format(step)

    def checkpoint_files(self) -> list[Path]:
        """The run's checkpoints, oldest first."""
        return checkpoint_files(self.path / self.CHECKPOINTS)

    # -- what a folder holds ------------------------------------------------------------------------
    def kind(self) -> str:
        """'new' (absent), 'empty', 'run', 'search', or 'foreign' (anything magmadnn did not write)."""
        folder = self.path
        if not folder.exists():
            return "new"
        if not folder.is_dir():
            return "foreign"
        try:
            names = {p.name for p in folder.iterdir()} - {self.LOCK}
        except OSError as exc:
            raise MagmaError(f"{folder}: cannot read the folder: {exc.strerror or exc}") from exc
        names = {n for n in names if not (n.startswith(f".{self.MARKER}.") and n.endswith(".tmp"))}  # killed mid-write
        if not names or (names == {self.MARKER} and self.writer() is None):
            return "empty"  # nothing, or only the marker of a command that ended before it wrote anything
        if self.MARKER in names or self.STASH in names:  # a stash alone: a replacing run killed as it began
            kind = self.marked().get("kind") if self.MARKER in names else \
                RunFolder(self.stash).marked().get("kind")
            return kind if kind in OLD_LAYOUTS else "foreign"
        for kind, (files, needed) in OLD_LAYOUTS.items():
            if needed in names and names <= files:
                return kind
        return "foreign"

    def marked(self) -> dict:
        """What the marker records (empty without one)."""
        return json_object(self.marker)

    def mark(self, kind: Kind, detail: dict, version: str) -> None:
        """Mark the folder as written by a command of `kind` (`detail`: e.g. a cross-validation's folds)."""
        write_json(self.marker, {"kind": kind, **detail, "magmadnn_version": version})

    def writer(self) -> int | None:
        """The PID of the live process on this host writing the folder now (None: none)."""
        return live_holder(self.lock)

    def listing(self, limit: int = 5) -> str:
        folder = self.path
        names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [folder.name]
        return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")

    def folds(self) -> int | None:
        """K for a cross-validation's folder (its marker says so; before markers did, its metrics.json)."""
        folds = self.marked().get("folds")
        if folds is None:
            metrics = json_object(self.metrics)
            folds = metrics.get("folds") if "per_fold" in metrics else None
        return folds if isinstance(folds, int) else None

    # -- choosing the folder a command writes ----------------------------------------------------------
    @staticmethod
    def choose(folder: Path, kind: Kind, explicit: bool, overwrite: bool = False, continuing: bool = False) -> Path:
        """The folder to write: `folder` itself, or for a default folder holding an earlier run the next
        free version of it. `continuing`: the command goes on with the run or search in `folder` (a
        resume). Raises a MagmaError naming the way out where the folder may not be written."""
        wanted = RunFolder(folder)
        state = wanted.kind()
        if state == "foreign":
            what = "is a file" if folder.exists() and not folder.is_dir() else \
                f"holds files magmadnn did not write ({wanted.listing()})"
            if explicit:
                raise MagmaError(f"--out {folder}: {what}; give a new or empty folder")
            return _next_version(folder)
        if state in ("new", "empty"):
            return folder
        if state != kind:
            if not explicit:
                return _next_version(folder)
            raise MagmaError(f"--out {folder}: holds a magmadnn {state}, not a {kind}; give another folder")
        if continuing or overwrite:
            return folder
        if not explicit:
            return _next_version(folder)
        if (pid := wanted.writer()) is not None:
            raise MagmaError(f"--out {folder}: another magmadnn (PID {pid}) is writing this folder now; wait for it, "
                             "stop it, or use another --out")
        verb = "tune --resume" if kind == "search" else "train --resume"
        raise MagmaError(f"--out {folder}: holds an earlier {kind} ({wanted.listing()}); it is not replaced. "
                         f"Use another --out, --overwrite to replace it, or `magmadnn {verb}` to continue it")

    @staticmethod
    def version_note(wanted: Path, chosen: Path, kind: Kind) -> str | None:
        """What to say once a run writes `chosen` in place of the default `wanted` (which holds an earlier
        run): said when the run starts writing, never before its checks have passed."""
        if chosen == wanted:
            return None
        return (f"{wanted} holds an earlier {kind}, which is kept; this {kind} writes {chosen} "
                "(--overwrite replaces the earlier one)")

    @staticmethod
    def newest_version(folder: Path, kind: Kind) -> Path:
        """The newest of `folder`, `folder`-2, `folder`-3, ... holding a `kind` (`folder` when none does):
        the one that the same command without --out wrote last (what `tune --resume` continues)."""
        pattern = re.compile(re.escape(folder.name) + r"(?:-(\d+))?")
        found = [(int(m.group(1) or 1), p) for p in (folder.parent.iterdir() if folder.parent.is_dir() else ())
                 if (m := pattern.fullmatch(p.name)) and RunFolder(p).kind() == kind]
        return max(found)[1] if found else folder

    # -- resolving what a command is given ---------------------------------------------------------------
    @staticmethod
    def model_file(path: Path) -> Path:
        """The model file `path` names: the file itself, or the model.npz of a run or search folder. A
        folder without one is an error saying what the folder holds and the command that makes a model."""
        path = Path(path)
        if not path.is_dir():
            _refuse_a_runs_config(path, "magmadnn model file", ModelFileError)
            return path
        if (folder := RunFolder(path)).model.is_file():
            return folder.model
        raise ModelFileError(folder.why_no_model())

    @staticmethod
    def starting_file(path: Path) -> Path:
        """The file --init-from reads: `path`, or a run folder's model.npz, else its newest checkpoint
        (a run stopped before its model was written still gives its weights)."""
        path = Path(path)
        if not path.is_dir():
            _refuse_a_runs_config(path, "model file or checkpoint", MagmaError)
            return path
        folder = RunFolder(path)
        if folder.model.is_file():
            return folder.model
        found = folder.checkpoint_files() or checkpoint_files(path)
        if not found:
            raise MagmaError(f"{path}: no {RunFolder.MODEL} and no checkpoint in this folder; expected a model file, "
                             "a checkpoint, or a run folder written by `magmadnn train`")
        return found[-1]

    @staticmethod
    def to_resume(path: Path) -> Path:
        """--resume's checkpoint: `path` itself, or the newest of a run folder or its checkpoints folder."""
        path = Path(path)
        if not path.exists():
            raise MagmaError(f"--resume {path}: no such file or directory")
        if path.is_file():
            return path
        found = RunFolder(path).checkpoint_files() or checkpoint_files(path)
        if not found:
            raise MagmaError(f"--resume {path}: no checkpoints in {RunFolder(path).checkpoints} (they are written "
                             "when training.checkpoint is on, the default, after every epoch)")
        return found[-1]

    def resume_command(self, ranks: int = 1) -> str:
        """The command that continues this run: the one that started it, with `--resume RUN_DIR` in place
        of --resume, --init-from, --out and --overwrite. Its layout (--processes, --hostfile, --hosts) is
        kept as the user gave it; a data-parallel run that another launcher started (mpiexec -n N, srun)
        gets `--processes N`."""
        args = sys.argv[1:]
        if not args or args[0] != "train":  # said by another command: the config the run wrote as it started
            args = ["train", str(self.config) if self.config.is_file() else "CONFIG"]
        kept, skip = [], False
        for arg in args:
            if skip:
                skip = False
            elif arg in ("--resume", "-r", "--init-from", "--out", "-o"):
                skip = True
            elif arg != "--overwrite" and not arg.startswith(("--resume=", "--init-from=", "--out=")):
                kept.append(arg)
        laid_out = any(a in LAYOUT or a.startswith(tuple(f"{flag}=" for flag in LAYOUT)) for a in kept)
        return shlex.join(["magmadnn", *kept, *(["--processes", str(ranks)] if ranks > 1 and not laid_out else []),
                           "--resume", str(self.path)])

    def why_no_model(self) -> str:
        """Why the folder holds no model.npz, and the command that writes one."""
        folder, kind, pid = self.path, self.kind(), self.writer()
        if kind in ("run", "search") and pid is not None:
            return f"{folder}: a magmadnn (PID {pid}) is writing this {kind} now; its {self.MODEL} is written when it ends"
        if self.stash.is_dir():
            return (f"{folder}: a command started with --overwrite was killed before it wrote its model; the earlier "
                    f"{kind} it was replacing is kept whole in {self.stash}: move its files back into {folder} to "
                    f"restore it, or run that command again")
        if kind == "run" and (checkpoints := self.checkpoint_files()):
            unknown = "" if self.config.is_file() else " (CONFIG: the config it was trained with)"
            return (f"{folder}: the run was interrupted before its model was written (newest checkpoint: "
                    f"{checkpoints[-1].name}); continue it with: {self.resume_command()}{unknown}")
        if kind == "run" and (folds := self.folds()) is not None:
            return self._cross_validation_note(folds)
        if kind == "run":
            config = shlex.quote(str(self.config)) if self.config.is_file() else "CONFIG"
            return (f"{folder}: the run stopped before its model was written, and left no checkpoint to resume "
                    f"from; train it again: magmadnn train {config} --out {shlex.quote(str(folder))} --overwrite")
        if kind == "search":
            return (f"{folder}: the search stopped before it wrote its best model; continue it with: magmadnn tune "
                    f"CONFIG --out {shlex.quote(str(folder))} --resume")
        return (f"{folder}: no {self.MODEL} in this folder; expected a model file or a run folder written by "
                "`magmadnn train` or `magmadnn tune`")

    def _cross_validation_note(self, folds: int) -> str:
        """A cross-validation writes no model: the command that trains one on its resolved config."""
        folder, config = self.path, self.config
        out = next(p for p in (folder.with_name(f"{folder.name}-model{'' if n == 1 else f'-{n}'}")
                               for n in range(1, 100_000)) if RunFolder(p).kind() in ("new", "empty"))
        command = shlex.join(["magmadnn", "train", str(config) if config.is_file() else "CONFIG", "--out", str(out)])
        unfinished = "" if config.is_file() else " (it did not finish; CONFIG: the config it ran)"
        return (f"{folder} is a cross-validation (train --folds {folds}), which writes no model{unfinished}; train "
                f"one with its config (holding back its validation and test splits) with: {command}")

    # -- the files other commands write beside a run ------------------------------------------------------
    def made(self) -> dict[str, str]:
        return {k: v for k, v in json_object(self.ledger).items() if isinstance(v, str)}


# What earlier versions (before the marker existed) left in a folder of each kind
OLD_LAYOUTS: dict[str, tuple[set[str], str]] = {
    "run": ({RunFolder.MODEL, RunFolder.METRICS, RunFolder.HISTORY, RunFolder.CONFIG, RunFolder.CHECKPOINTS},
            RunFolder.CONFIG),
    "search": ({RunFolder.JOURNAL, RunFolder.TRIALS_TABLE, RunFolder.BEST_CONFIG, RunFolder.MODEL, RunFolder.TRIALS},
               RunFolder.JOURNAL),
}
_CHECKPOINT = re.compile(RunFolder.CHECKPOINT_NAME)


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoints in `folder` (a run's checkpoints/), oldest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def _next_version(folder: Path) -> Path:
    for n in range(2, 100_000):
        candidate = folder.with_name(f"{folder.name}-{n}")
        if RunFolder(candidate).kind() in ("new", "empty"):
            return candidate
    raise MagmaError(f"{folder}: no free version of this folder name; clean up {folder.parent}")


def _refuse_a_runs_config(path: Path, what: str, error: type[MagmaError]) -> None:
    """A run's config.yaml given where its model is read: the model beside it, named."""
    if path.name == RunFolder.CONFIG and (model := RunFolder(path.parent).model).is_file():
        raise error(f"{path}: not a readable {what} (a YAML config, not a model file; the run's model is "
                             f"beside it: give {model} (or {path.parent}))")


def record_made(path: Path, data: bytes) -> None:
    """`path`, just written with `data`, is magmadnn's: noted where its folder is a run folder (a
    file written anywhere else leaves no ledger behind)."""
    folder = RunFolder(path.parent)
    if folder.marker.is_file():
        write_json(folder.ledger, {**folder.made(), path.name: hashlib.sha256(data).hexdigest()})


def is_made(path: Path) -> bool:
    """Whether `path` holds what magmadnn wrote there (False for a file a person made or changed)."""
    digest = RunFolder(path.parent).made().get(path.name)
    return digest is not None and file_sha256(path) == digest


def remove_made(path: Path) -> bool:
    """Remove `path` if magmadnn made it; returns whether a file of a person's stays there."""
    if not path.is_file():
        return False
    if is_made(path):
        path.unlink()
        return False
    return True
