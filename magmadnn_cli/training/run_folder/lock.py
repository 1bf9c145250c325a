"""The lock of a folder a command writes: `<folder>/.magmadnn.lock` (JSON: who holds it, `holder`),
held from the command's first write to its end; with --overwrite the earlier run there is set aside
as the lock is taken and settled as it is released (`replacing`)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ... import __version__, signals
from ...distributed.comm import on_root
from ...distributed.leftovers import record_run_folder
from ...errors import MagmaError
from ...files import cannot_write
from .folder import Kind, RunFolder
from .holder import alive, busy, held_elsewhere, holder, identity
from .replacing import set_aside, settle

if TYPE_CHECKING:
    from ...reporting import Reporter


class FolderLock:
    """Holds `<folder>/.magmadnn.lock` while a command writes the folder; refuses a folder that a
    live process holds (naming its PID); takes over the lock of a process that died on this host, or of
    this Slurm job's run before it was requeued; names the host and job of any other holder.
    `replace` (--overwrite): the earlier run there is set aside as the lock is taken, put back if the
    command fails or is stopped, and deleted once it has written its model (`replacing`)."""

    def __init__(self, folder: Path, kind: Kind, detail: dict[str, Any] | None = None, replace: bool = False) -> None:
        self.folder, self.kind, self.detail, self.replace = Path(folder), kind, detail or {}, replace
        self.run_folder = RunFolder(self.folder)
        self.path = self.run_folder.lock
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
        data = memoryview(json.dumps(identity()).encode())
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
        if self.replace:
            self.replacing, self.stayed = set_aside(self.folder)
        self.run_folder.mark(self.kind, self.detail, __version__)

    def _refuse_if_live(self) -> None:
        """Refuse a lock that a live run holds. On this host its PID says; on another host a requeued
        Slurm job (the same job id, a higher restart count: the earlier incarnation has ended) takes it
        over, and any other holder is named with the safe fix."""
        held, me = holder(self.path), identity()
        if held is None:
            return  # unreadable: a writer killed before it wrote the lock's contents
        pid, host, job = held["pid"], held["host"], held.get("slurm_job")
        if job is not None and job == me.get("slurm_job") and me["slurm_restart"] > held.get("slurm_restart", 0):
            return  # this job was requeued: Slurm ended every step of the earlier run before restarting it
        if host == me["host"]:
            if pid != me["pid"] and alive(pid, held.get("started")):
                raise MagmaError(busy(self.folder, pid))
            return
        raise MagmaError(held_elsewhere(self.folder, self.path, held, me))

    def release(self, exc: BaseException | None = None) -> BaseException | None:
        """Release the lock as the command ends (`exc`: how it failed, None: it ended well). The run it
        replaced is deleted or put back (`settle`); a command that wrote nothing (it failed first)
        leaves nothing behind. Returns the error to raise: `exc`, or one that says what was put back."""
        if not self.held:
            return exc
        with signals.held():  # a second Ctrl-C must not stop a stash halfway back
            exc = settle(self.folder, self.kind, self.replacing, exc)
            self.path.unlink(missing_ok=True)
            self.held = False
            try:
                left = {p.name for p in self.folder.iterdir()}
                provisional = {RunFolder.CONFIG} if self.kind == "run" else set()  # a run writes it as it starts
                if left <= {RunFolder.MARKER, *provisional}:
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

    def say_replacing(self, reporter: "Reporter") -> None:
        """Rank 0, once the command's checks have passed: the earlier run it replaces (--overwrite) is
        set aside until this one has written its results, and a person's files beside it stay."""
        if not self.replacing:
            return
        reporter.info(f"this {self.kind} replaces the earlier {self.kind} in {self.folder}, set aside in "
                      f"{RunFolder.STASH} until this one has written its results (put back if it fails or is stopped)")
        if self.stayed:
            reporter.warn(f"kept {', '.join(self.stayed)} in {self.folder}: not written by magmadnn (or changed "
                          "since), so left where they are, though the run they sit beside is replaced")


def say_replacing(lock: FolderLock | None, reporter: "Reporter") -> None:
    """`FolderLock.say_replacing` on rank 0 (other ranks hold no lock: None)."""
    if lock is not None:
        lock.say_replacing(reporter)


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
