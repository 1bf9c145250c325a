"""What a job that did not end cleanly leaves, for the launcher of `--processes N` to deal with: the
run folder its rank 0 claimed (written to a record file the launcher names, so the launcher can say
how to continue the run), and the MPI shared-memory segments in /dev/shm that killed ranks never
unlinked (MPICH removes its segments at MPI_Finalize: a SIGKILLed job left 2 MB of RAM each time).
A rank that aborts the job unlinks the segments it maps first (`unlink_own_segments`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

RUN_RECORD = "MAGMADNN_RUN_RECORD"  # the file rank 0 writes the run folder it claims to
SHM = Path("/dev/shm")
SEGMENTS = ("mpich_shm_",)  # the names MPICH gives its shared-memory segments


def record_path() -> Path:
    """This launcher's record file (its PID in the name: one per launch)."""
    return Path(tempfile.gettempdir()) / f"magmadnn-run-{os.getpid()}"


def record_run_folder(folder: Path) -> None:
    """On rank 0 of a launch: note the run folder it claimed (nothing outside a launch)."""
    record = os.environ.get(RUN_RECORD)
    if record:
        with contextlib.suppress(OSError):
            Path(record).write_text(os.path.abspath(folder))


def take_run_folder() -> Path | None:
    """The run folder the job's rank 0 claimed (None if it claimed none); the record is removed."""
    path = record_path()
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    path.unlink(missing_ok=True)
    return Path(text) if text else None


def segments() -> set[str]:
    """The MPI shared-memory segments in /dev/shm now (none where there is no /dev/shm)."""
    try:
        return {p.name for p in SHM.iterdir() if p.name.startswith(SEGMENTS)}
    except OSError:
        return set()


def sweep(before: set[str]) -> list[str]:
    """Remove the segments that appeared since `before` and that no process maps or holds open (the
    job's killed ranks could not unlink them; another job's are in use); returns their names."""
    new = segments() - before
    if not new:
        return []
    left = sorted(new - _in_use())
    for name in left:
        with contextlib.suppress(OSError):
            (SHM / name).unlink()
    return left


def unlink_own_segments() -> None:
    """Before MPI_Abort (which skips MPI_Finalize, where MPICH unlinks them): unlink the segments this
    process maps. The other ranks keep their mappings; only the names go, so nothing is left."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            names = {line.split("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/" in line}
        for name in names:
            if name.startswith(SEGMENTS):
                with contextlib.suppress(OSError):
                    (SHM / name).unlink()


def _in_use() -> set[str]:
    """Names of /dev/shm files that some process maps or holds open (as far as /proc lets us see)."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                used |= {line.split("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/" in line}
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        used.add(target[len("/dev/shm/"):].split()[0])
    return used
