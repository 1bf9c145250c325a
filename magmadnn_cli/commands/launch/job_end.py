"""How a --processes job that did not end by itself ended, and how to go on: a rank killed (which
ends every rank), or the job killed by its launcher after a second stop signal. The folder its rank 0
claimed says what is left: a search's journal, the newest checkpoint, or nothing yet."""

from __future__ import annotations

import shlex
import signal
from pathlib import Path

from ...distributed.launcher import FORCE_AFTER, KILLING, JobEnded, JobForced
from ...distributed.leftovers import take_run_folder
from ...errors import MagmaError
from ...training.run_folder import RunFolder, holder_alive, put_back

CAUSES = {signal.SIGKILL: "killed (SIGKILL: the out-of-memory killer, a scheduler, or kill -9)",
          signal.SIGSEGV: "ended by SIGSEGV (a crash)", signal.SIGBUS: "ended by SIGBUS (a crash, or /dev/shm full)",
          signal.SIGABRT: "aborted (SIGABRT)"}


def killed_job(code: int) -> MagmaError | None:
    """After a --processes job ended with `code`: for one a killed rank ended (128 + the signal), the
    error that says how to go on from the folder its rank 0 claimed; else None."""
    folder = take_run_folder()  # read, and removed, whatever the ending
    return JobEnded(killed_job_message(code - 128, folder), code) if code - 128 in KILLING else None


def forced_job(forced: JobForced) -> MagmaError:
    """The error for a job killed after a second stop signal, saying how to go on."""
    head = (f"the job went on {FORCE_AFTER:g} s after a second {forced} (its ranks were inside MPI, or starting it, "
            "where a signal waits), so every process of it was killed")
    return JobEnded(_going_on(head, take_run_folder()), forced.exit_code)


def killed_job_message(signum: int, folder: Path | None) -> str:
    """What the launcher of --processes says when a rank was killed, which ended the whole job: how to
    go on from what the run folder (`folder`: the one its rank 0 claimed) holds."""
    return _going_on(f"a rank was {CAUSES.get(signum, f'ended by signal {signum}')}, which ends every rank of the job",
                     folder)


def _going_on(head: str, folder: Path | None) -> str:
    """`head`, and how to go on from what the run folder holds (None: the job claimed none)."""
    from ..tune.trial_log import resume_command as search_resume  # only after a killed job
    if folder is None:
        return f"{head}, before it claimed its folder: nothing was written; run the command again"
    run = RunFolder(folder)
    if put_back_after_kill(folder):
        return f"{head}; the earlier {run.kind()} in {folder}, which it was replacing (--overwrite), is put back as it was"
    if run.kind() == "search":
        return f"{head}; the finished trials are journaled in {folder}. Continue with: {search_resume(folder)}"
    if checkpoints := run.checkpoint_files():
        return f"{head}; the newest checkpoint: {checkpoints[-1]}. Continue with: {run.resume_command()}"
    return (f"{head}; {folder} holds no checkpoint yet: train again with --out {shlex.quote(str(folder))} "
            "--overwrite")


def put_back_after_kill(folder: Path) -> bool:
    """A job killed while it replaced an earlier run (--overwrite): that run is put back, and the
    dead job's lock removed. Returns whether there was one."""
    lock = RunFolder(folder).lock
    if holder_alive(lock) or not put_back(folder):
        return False
    lock.unlink(missing_ok=True)
    return True
