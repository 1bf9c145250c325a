"""Output folders: a command never replaces what magmadnn did not write, never silently replaces an
earlier run, and never shares a folder with a live run.

A folder a command writes holds a marker, `.magmadnn` (JSON: what wrote it), and, while a command
writes it, a lock, `.magmadnn.lock` (JSON: PID, host, any Slurm job id and restart count).
Re-running a config writes a new version of its default folder (runs/NAME, runs/NAME-2, runs/NAME-3,
... as Ludwig's experiment_run_N); an
explicit `--out` holding an earlier run is refused unless `--overwrite`; a folder holding anything
else (the user's own files) is refused always. The same rule holds for `train`, `train --folds` and
`tune` (whose default folder is runs/NAME-tune). `predict` and `evaluate` read a run folder's model, or
say why it holds none (`model_file`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
from pathlib import Path
from typing import Any, Iterator, Literal

from .. import __version__
from ..distributed.comm import on_root
from ..distributed.leftovers import record_run_folder
from ..errors import MagmaError, ModelFileError
from .. import signals
from ..files import MODEL, cannot_write, json_object, write_json
from ..training.advice import resume_command

MARKER = ".magmadnn"
LOCK = ".magmadnn.lock"
STASH = ".magmadnn-replaced"  # an earlier run that an --overwrite run set aside (set_aside)
Kind = Literal["run", "search"]
# What earlier versions (before the marker existed) left in a folder of each kind
OLD_LAYOUTS: dict[str, tuple[set[str], str]] = {
    "run": ({"model.npz", "metrics.json", "metrics.csv", "config.yaml", "checkpoints"}, "config.yaml"),
    "search": ({"trials.jsonl", "trials.csv", "best_config.yaml", "model.npz", "trials"}, "trials.jsonl"),
}


def classify(folder: Path) -> str:
    """'new' (absent), 'empty', 'run', 'search', or 'foreign' (anything magmadnn did not write)."""
    if not folder.exists():
        return "new"
    if not folder.is_dir():
        return "foreign"
    try:
        names = {p.name for p in folder.iterdir()} - {LOCK}
    except OSError as exc:
        raise MagmaError(f"{folder}: cannot read the folder: {exc.strerror or exc}") from exc
    names = {n for n in names if not (n.startswith(f".{MARKER}.") and n.endswith(".tmp"))}  # a marker killed mid-write
    if not names or (names == {MARKER} and _live_holder(folder) is None):
        return "empty"  # nothing, or only the marker of a command that ended before it wrote anything
    if MARKER in names or STASH in names:  # a stash alone: a replacing run killed as it began
        kind = json_object(folder / MARKER if MARKER in names else folder / STASH / MARKER).get("kind")
        return kind if kind in OLD_LAYOUTS else "foreign"
    for kind, (files, needed) in OLD_LAYOUTS.items():
        if needed in names and names <= files:
            return kind
    return "foreign"


def _listing(folder: Path, limit: int = 5) -> str:
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [folder.name]
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def choose(folder: Path, kind: Kind, explicit: bool, overwrite: bool = False, continuing: bool = False) -> Path:
    """The folder to write: `folder` itself, or for a default folder holding an earlier run the next
    free version of it. `continuing`: the command goes on with the run or search in `folder` (a
    resume). Raises a MagmaError naming the way out where the folder may not be written."""
    state = classify(folder)
    if state == "foreign":
        what = "is a file" if folder.exists() and not folder.is_dir() else f"holds files magmadnn did not write ({_listing(folder)})"
        if explicit:
            raise MagmaError(f"--out {folder}: {what}; give a new or empty folder")
        return _next_version(folder, kind)
    if state in ("new", "empty"):
        return folder
    if state != kind:
        if not explicit:
            return _next_version(folder, kind)
        raise MagmaError(f"--out {folder}: holds a magmadnn {state}, not a {kind}; give another folder")
    if continuing or overwrite:
        return folder
    if explicit:
        if (pid := _live_holder(folder)) is not None:
            raise MagmaError(f"--out {_busy(folder, pid)}")
        verb = "tune --resume" if kind == "search" else "train --resume"
        raise MagmaError(f"--out {folder}: holds an earlier {kind} ({_listing(folder)}); it is not replaced. "
                         f"Use another --out, --overwrite to replace it, or `magmadnn {verb}` to continue it")
    return _next_version(folder, kind)


def version_note(wanted: Path, chosen: Path, kind: Kind) -> str | None:
    """What to say once a run writes `chosen` in place of the default `wanted` (which holds an earlier
    run): said when the run starts writing, never before its checks have passed."""
    if chosen == wanted:
        return None
    return (f"{wanted} holds an earlier {kind}, which is kept; this {kind} writes {chosen} "
            "(--overwrite replaces the earlier one)")


def newest_version(folder: Path, kind: Kind) -> Path:
    """The newest of `folder`, `folder`-2, `folder`-3, ... holding a `kind` (`folder` when none does):
    the one that the same command without --out wrote last (what `tune --resume` continues)."""
    pattern = re.compile(re.escape(folder.name) + r"(?:-(\d+))?")
    found = [(int(m.group(1) or 1), p) for p in (folder.parent.iterdir() if folder.parent.is_dir() else ())
             if (m := pattern.fullmatch(p.name)) and classify(p) == kind]
    return max(found)[1] if found else folder


def _next_version(folder: Path, kind: Kind) -> Path:
    for n in range(2, 100_000):
        candidate = folder.with_name(f"{folder.name}-{n}")
        if classify(candidate) in ("new", "empty"):
            return candidate
    raise MagmaError(f"{folder}: no free version of this folder name; clean up {folder.parent}")


class FolderLock:
    """Holds `<folder>/.magmadnn.lock` while a command writes the folder; refuses a folder that a
    live process holds (naming its PID); takes over the lock of a process that died on this host, or of
    this Slurm job's run before it was requeued; names the host and job of any other holder.
    `replace` (--overwrite): the earlier run there is set aside as the lock is taken, put back if the
    command fails or is stopped, and deleted once it has written its model (`set_aside`)."""

    def __init__(self, folder: Path, kind: Kind, detail: dict[str, Any] | None = None, replace: bool = False) -> None:
        self.folder, self.kind, self.detail, self.replace = Path(folder), kind, detail or {}, replace
        self.path = self.folder / LOCK
        self.held = False
        self.replacing = False  # an earlier run is set aside, to put back if this command fails
        self.stayed: list[str] = []  # a person's files beside the run it replaces, left where they are

    def __enter__(self) -> "FolderLock":
        self.created = [f for f in (self.folder, *self.folder.parents) if not f.exists()]  # deepest first
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._remove_created()  # the parents made before the failure
            raise MagmaError(f"{self.folder}: cannot create the folder: {exc.strerror or exc}") from exc
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._refuse_if_live()
                self.path.unlink(missing_ok=True)  # the holder died: take over
                continue
            except OSError as exc:
                self._remove_created()  # leave nothing behind
                raise cannot_write(self.folder, exc) from exc
            self._write_lock(fd)
            self.held = True
            try:
                self._claim()
            except BaseException as exc:  # noqa: BLE001  a Ctrl-C too: the lock is released, then it goes on
                raise self.release(exc) from None
            record_run_folder(self.folder)  # for the launcher of --processes, if the job ends killed
            return self
        raise MagmaError(f"{self.path}: another process keeps taking this lock; try again")

    def __exit__(self, kind: object = None, exc: BaseException | None = None, tb: object = None) -> None:
        ended = self.release(exc)
        if ended is not exc:
            raise ended from exc

    def _write_lock(self, fd: int) -> None:
        """Who holds the lock, written whole; a full disk removes it and says so."""
        data = memoryview(json.dumps(_identity()).encode())
        try:
            try:
                while data:
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)
        except OSError as exc:
            self.path.unlink(missing_ok=True)
            self._remove_created()
            raise cannot_write(self.path, exc) from exc

    def _claim(self) -> None:
        """Set aside the run this command replaces (`replace`), then mark the folder as this command's."""
        from .set_aside import set_aside  # set_aside reads this module's names
        if self.replace:
            self.replacing, self.stayed = set_aside(self.folder)
        write_json(self.folder / MARKER, {"kind": self.kind, **self.detail, "magmadnn_version": __version__})

    def _refuse_if_live(self) -> None:
        """Refuse a lock that a live run holds. On this host its PID says; on another host a requeued
        Slurm job (the same job id, a higher restart count: the earlier incarnation has ended) takes it
        over, and any other holder is named with the safe fix."""
        holder, me = _holder(self.folder), _identity()
        if holder is None:
            return  # unreadable: a writer killed before it wrote the lock's contents
        pid, host, job = holder["pid"], holder["host"], holder.get("slurm_job")
        if job is not None and job == me.get("slurm_job") and me["slurm_restart"] > holder.get("slurm_restart", 0):
            return  # this job was requeued: Slurm ended every step of the earlier run before restarting it
        if host == me["host"]:
            if pid != me["pid"] and _alive(pid, holder.get("started")):
                raise MagmaError(_busy(self.folder, pid))
            return
        raise MagmaError(_held_elsewhere(self.folder, self.path, holder, me))

    def release(self, exc: BaseException | None = None) -> BaseException | None:
        """Release the lock as the command ends (`exc`: how it failed, None: it ended well). The run it
        replaced is deleted or put back (`settle`); a command that wrote nothing (it failed first)
        leaves nothing behind. Returns the error to raise: `exc`, or one that says what was put back."""
        if not self.held:
            return exc
        with signals.held():  # a second Ctrl-C must not stop a stash halfway back
            from .set_aside import settle  # set_aside reads this module's names
            exc = settle(self, exc)
            self.path.unlink(missing_ok=True)
            self.held = False
            try:
                left = {p.name for p in self.folder.iterdir()}
                provisional = {"config.yaml"} if self.kind == "run" else set()  # a run writes it as it starts
                if left <= {MARKER, *provisional}:
                    for name in left:
                        (self.folder / name).unlink(missing_ok=True)
                    self._remove_created()
            except OSError:
                pass
        return exc

    def _remove_created(self) -> None:
        """Remove the folders `__enter__` made (the run folder, then the parents it made: runs/),
        each only while empty: another run may have started in one meanwhile."""
        for folder in self.created:
            try:
                folder.rmdir()
            except OSError:
                if os.path.isdir(folder):  # not empty: keep it and its parents (else mkdir never made it)
                    return


def _identity() -> dict[str, Any]:
    """What a lock records of its holder: PID, its start (a reused PID is told apart), host and, inside a
    Slurm job, the job id and restart count."""
    me: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname()}
    if (started := _started(os.getpid())) is not None:
        me["started"] = started
    if job := os.environ.get("SLURM_JOB_ID"):
        restarts = os.environ.get("SLURM_RESTART_COUNT", "")
        me.update(slurm_job=job, slurm_restart=int(restarts) if restarts.isdigit() else 0)
    return me


def _held_elsewhere(folder: Path, lock: Path, holder: dict[str, Any], me: dict[str, Any]) -> str:
    """Why a lock taken on another host is not taken over, and the safe fix."""
    pid, host, job = holder["pid"], holder["host"], holder.get("slurm_job")
    here = f" (this run is on {me['host']}" + (f" in Slurm job {me['slurm_job']}" if me.get("slurm_job") else "") + ")"
    if job is None:
        return f"{folder}: locked by a magmadnn on {host} (PID {pid}){here}; if it is no longer running, remove {lock}"
    said = f"{folder}: locked by a magmadnn on {host} (PID {pid}) in Slurm job {job}{here}"
    if job == me.get("slurm_job"):
        return (f"{said}: another step of this job at the same restart ({holder.get('slurm_restart', 0)}), so not a "
                f"requeue; two runs must not write one folder: use another --out, or once that step has ended, "
                f"remove {lock}")
    return (f"{said}; if that job is no longer running (`squeue -j {job}` lists nothing), remove {lock}; else wait "
            "for it or use another --out")


def _holder(folder: Path) -> dict[str, Any] | None:
    """What the lock of `folder` records of its holder (pid, host, any slurm_job and slurm_restart);
    None without a readable lock."""
    try:
        holder = json.loads((folder / LOCK).read_text(encoding="utf-8"))
        found: dict[str, Any] = {"pid": int(holder["pid"]), "host": str(holder["host"])}
        if isinstance(holder.get("started"), int):
            found["started"] = holder["started"]
        if holder.get("slurm_job") is not None:
            found.update(slurm_job=str(holder["slurm_job"]), slurm_restart=int(holder.get("slurm_restart") or 0))
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _live_holder(folder: Path) -> int | None:
    """The PID of the live process on this host that holds the folder's lock (None: no such process)."""
    holder = _holder(folder)
    if holder is None or holder["host"] != socket.gethostname():
        return None
    return holder["pid"] if _alive(holder["pid"], holder.get("started")) else None


def holder_alive(folder: Path) -> bool:
    """Whether the folder's lock is held by a live process (here or, as far as one can tell, on another host)."""
    holder = _holder(folder)
    return holder is not None and (holder["host"] != socket.gethostname() or _live_holder(folder) is not None)


def _busy(folder: Path, pid: int) -> str:
    return f"{folder}: another magmadnn (PID {pid}) is writing this folder now; wait for it, stop it, or use another --out"


def _alive(pid: int, started: int | None = None) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped, does not), and started at
    `started` where given (else its PID was reused by another process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: its start time still tells a reused PID apart
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc (not Linux): trust the signal
    return fields[0] not in ("Z", "X") and (started is None or int(fields[19]) == started)


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from the state on (None without /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def _started(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (None without /proc)."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def locked(comm: Any, folder: Path, kind: Kind, detail: dict[str, Any] | None = None,
           replace: bool = False) -> contextlib.AbstractContextManager:
    """The folder's lock, held by rank 0 for the `with` block (which gets it; None on other ranks); a
    refusal is raised on every rank. `detail` is recorded in the folder's marker (e.g. a
    cross-validation's folds); `replace`: the earlier run there is set aside (FolderLock)."""
    lock = FolderLock(folder, kind, detail, replace)
    on_root(comm, lambda: lock.__enter__() and None)
    return _released_at_exit(lock) if comm.is_root else contextlib.nullcontext()


@contextlib.contextmanager
def _released_at_exit(lock: FolderLock) -> Iterator[FolderLock]:
    """The lock (taken on rank 0) released as the command ends, as `FolderLock.__exit__` releases it."""
    try:
        yield lock
    except BaseException as exc:
        lock.__exit__(type(exc), exc)  # raises what the release made of it, if anything else
        raise
    lock.__exit__()


# -- reading a run folder's model -------------------------------------------------------------------
def model_file(path: Path) -> Path:
    """The model file `path` names: the file itself, or the model.npz of a run or search folder. A
    folder without one is an error saying what the folder holds and the command that makes a model."""
    path = Path(path)
    if not path.is_dir():
        return path
    if (path / MODEL).is_file():
        return path / MODEL
    raise ModelFileError(_no_model(path))


def _no_model(folder: Path) -> str:
    """Why `folder` holds no model.npz, and the command that writes one."""
    from ..training.checkpoint import listing  # heavy: only when a folder lacks its model
    kind, pid = classify(folder), _live_holder(folder)
    if kind in ("run", "search") and pid is not None:
        return f"{folder}: a magmadnn (PID {pid}) is writing this {kind} now; its {MODEL} is written when it ends"
    if (folder / STASH).is_dir():
        return (f"{folder}: a command started with --overwrite was killed before it wrote its model; the earlier "
                f"{kind} it was replacing is kept whole in {folder / STASH}: move its files back into {folder} to "
                f"restore it, or run that command again")
    if kind == "run" and (checkpoints := listing(folder / "checkpoints")):
        unknown = "" if (folder / "config.yaml").is_file() else " (CONFIG: the config it was trained with)"
        return (f"{folder}: the run was interrupted before its model was written (newest checkpoint: "
                f"{checkpoints[-1].name}); continue it with: {resume_command(folder)}{unknown}")
    if kind == "run" and (folds := _folds(folder)) is not None:
        return _cross_validation_note(folder, folds)
    if kind == "run":
        config = shlex.quote(str(folder / "config.yaml")) if (folder / "config.yaml").is_file() else "CONFIG"
        return (f"{folder}: the run stopped before its model was written, and left no checkpoint to resume from; "
                f"train it again: magmadnn train {config} --out {shlex.quote(str(folder))} --overwrite")
    if kind == "search":
        return (f"{folder}: the search stopped before it wrote its best model; continue it with: magmadnn tune "
                f"CONFIG --out {shlex.quote(str(folder))} --resume")
    return (f"{folder}: no {MODEL} in this folder; expected a model file or a run folder written by "
            "`magmadnn train` or `magmadnn tune`")


def _folds(folder: Path) -> int | None:
    """K for a cross-validation's folder (its marker says so; before markers did, its metrics.json)."""
    folds = json_object(folder / MARKER).get("folds")
    if folds is None:
        metrics = json_object(folder / "metrics.json")
        folds = metrics.get("folds") if "per_fold" in metrics else None
    return folds if isinstance(folds, int) else None


def _cross_validation_note(folder: Path, folds: int) -> str:
    """A cross-validation writes no model: the command that trains one on its resolved config."""
    config = folder / "config.yaml"
    out = next(p for p in (folder.with_name(f"{folder.name}-model{'' if n == 1 else f'-{n}'}")
                           for n in range(1, 100_000)) if classify(p) in ("new", "empty"))
    command = shlex.join(["magmadnn", "train", str(config) if config.is_file() else "CONFIG", "--out", str(out)])
    unfinished = "" if config.is_file() else " (it did not finish; CONFIG: the config it ran)"
    return (f"{folder} is a cross-validation (train --folds {folds}), which writes no model{unfinished}; train one "
            f"with its config (holding back its validation and test splits) with: {command}")
