"""--overwrite keeps what it replaces until it is replaced. As a run, cross-validation or search takes
the lock of a folder holding an earlier one, magmadnn's files of that one (model, metrics, config,
checkpoints, journal, marker, its exports and plots) are moved into `<folder>/.magmadnn-replaced`
(a rename: the same file system, no copy, no space needed). Once the new one has written its model
they are deleted; if it fails, is stopped or finds the disk full, what it wrote is removed and they
are put back as they were. A person's own files stay where they are throughout.

A stash left by a replacing run that was killed (SIGKILL, an MPI abort) holds the earlier run still:
the launcher of --processes puts it back (`commands/launch/job_end`), a later --overwrite keeps it as the run
to put back (the killed run's files are what it replaces), and a --resume of the killed run deletes it
once the resumed run writes its model."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

from ... import signals
from ...errors import Interrupted, MagmaError
from ...files import cannot_write, disk_full
from .folder import RunFolder, is_made

# What magmadnn writes in a run or search folder (besides the lock); plots and exports are the
# ledger's (`is_made`), and only while unchanged
OURS = frozenset({RunFolder.MARKER, RunFolder.LEDGER, RunFolder.MODEL, RunFolder.METRICS, RunFolder.HISTORY,
                  RunFolder.CONFIG, RunFolder.CHECKPOINTS, RunFolder.MLFLOW, RunFolder.TENSORBOARD, RunFolder.JOURNAL,
                  RunFolder.TRIALS_TABLE, RunFolder.BEST_CONFIG, RunFolder.TRIALS})


def ours(folder: Path) -> list[str]:
    """The names in `folder` that magmadnn wrote: what a replacing run sets aside, or removes."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    return [n for n in names if n in OURS or (n.startswith(".") and n.endswith(".tmp")) or
            (n not in (RunFolder.LOCK, RunFolder.STASH) and (folder / n).is_file() and is_made(folder / n))]


def set_aside(folder: Path) -> tuple[bool, list[str]]:
    """Move the earlier run's files into the stash. Returns whether a run is set aside (False: the
    folder holds none, nothing moved) and the names of a person's files, which stay. With a stash
    already there (its replacing run was killed), the folder's files are that killed run's: removed,
    the stash kept as the run to put back."""
    stash = RunFolder(folder).stash
    names = ours(folder)  # the ledger is read before it moves
    if stash.is_dir():
        _remove(folder, names)
    elif set(names) - {RunFolder.MARKER, RunFolder.LEDGER}:
        stash.mkdir()
        for name in names:
            os.rename(folder / name, stash / name)
    return stash.is_dir(), sorted(set(os.listdir(folder)) - {RunFolder.LOCK, RunFolder.STASH, *names})


def drop(folder: Path) -> bool:
    """The new run has written its model: delete the stash (returns whether there was one)."""
    stash = RunFolder(folder).stash
    if not stash.is_dir():
        return False
    shutil.rmtree(stash, ignore_errors=True)
    return True


def put_back(folder: Path) -> bool:
    """Remove what the replacing run wrote and move the earlier run's files back (returns whether
    there was a stash). A file of the same name that a person put there meanwhile is kept in the stash."""
    stash = RunFolder(folder).stash
    if not stash.is_dir():
        return False
    _remove(folder, ours(folder))
    for name in os.listdir(stash):
        if not os.path.lexists(folder / name):
            os.rename(stash / name, folder / name)
    with contextlib.suppress(OSError):
        stash.rmdir()
    return True


def _remove(folder: Path, names: list[str]) -> None:
    for name in names:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def without_stale_advice(message: str, folder: Path) -> str:
    """A message without what it says of the replacing run's checkpoints (removed with it): no
    `Continue with:` line, no later clause or sentence naming a file under `folder`/checkpoints."""
    checkpoints = str(RunFolder(folder).checkpoints)
    kept = []
    for line in message.splitlines():
        if line.startswith("Continue with:"):
            continue
        head, *parts = line.split("; ")  # the head says what failed: kept, whatever it names
        line = "; ".join([head, *(part for part in parts if checkpoints not in part)])
        head, *sentences = line.split(". ")
        kept.append(". ".join([head, *(sentence for sentence in sentences if checkpoints not in sentence)]))
    return "\n".join(kept).rstrip()


def settle(folder: Path, kind: str, replacing: bool, exc: BaseException | None) -> BaseException | None:
    """As a command of `kind` ends: delete the stash of the run it replaced once it has written its
    model (a stopped search that wrote its best model counts), else put that run back (`replacing`:
    this command set it aside) and say so in the error it raises. A full disk's bare OSError becomes
    the message naming its file. Returns the error."""
    if isinstance(exc, OSError) and disk_full(exc):
        exc = cannot_write(Path(exc.filename) if exc.filename else folder, exc)
    if not RunFolder(folder).stash.is_dir():
        return exc
    stopped_search = isinstance(exc, Interrupted) and kind == "search" and RunFolder(folder).model.is_file()
    if exc is None or stopped_search:
        drop(folder)
        return exc
    if not replacing:
        return exc  # a resumed run of a killed replacing run: the earlier run stays set aside
    put_back(folder)
    return _said_back(exc, folder, kind)


def _said_back(exc: BaseException, folder: Path, kind: str) -> BaseException:
    """`exc` with the word that the earlier run is back (and without advice on the removed checkpoints)."""
    note = (f"the earlier {kind} in {folder} is put back as it was (--overwrite replaces it only once "
            f"a new {kind} has written its results; what this one wrote is removed)")
    if isinstance(exc, MagmaError):
        exc.args = (f"{without_stale_advice(str(exc), folder)}\n{note}", *exc.args[1:])
        return exc
    if isinstance(exc, KeyboardInterrupt):
        signum = signals.received() or signal.SIGINT
        return Interrupted(f"stopped by {signal.Signals(signum).name}; {note}", signum)
    return exc  # a bug: its own message, the earlier run put back all the same
