"""Who holds a run folder's lock (JSON: PID, its start time, host, any Slurm job id and restart
count), and whether that process still runs. Takes the lock file's path: the folder names it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from ...processes import alive, start_time


def identity() -> dict[str, Any]:
    """What a lock records of its holder: PID, its start (a reused PID is told apart), host and, inside a
    Slurm job, the job id and restart count."""
    me: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname()}
    if (started := start_time(os.getpid())) is not None:
        me["started"] = started
    if job := os.environ.get("SLURM_JOB_ID"):
        restarts = os.environ.get("SLURM_RESTART_COUNT", "")
        me.update(slurm_job=job, slurm_restart=int(restarts) if restarts.isdigit() else 0)
    return me


def holder(lock: Path) -> dict[str, Any] | None:
    """What the lock file records of its holder (pid, host, any slurm_job and slurm_restart); None
    without a readable lock."""
    try:
        held = json.loads(lock.read_text(encoding="utf-8"))
        found: dict[str, Any] = {"pid": int(held["pid"]), "host": str(held["host"])}
        if isinstance(held.get("started"), int):
            found["started"] = held["started"]
        if held.get("slurm_job") is not None:
            found.update(slurm_job=str(held["slurm_job"]), slurm_restart=int(held.get("slurm_restart") or 0))
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def live_holder(lock: Path) -> int | None:
    """The PID of the live process on this host that holds the lock (None: no such process)."""
    held = holder(lock)
    if held is None or held["host"] != socket.gethostname():
        return None
    return held["pid"] if alive(held["pid"], held.get("started")) else None


def holder_alive(lock: Path) -> bool:
    """Whether the lock is held by a live process (here or, as far as one can tell, on another host)."""
    held = holder(lock)
    return held is not None and (held["host"] != socket.gethostname() or live_holder(lock) is not None)


def busy(folder: Path, pid: int) -> str:
    return f"{folder}: another magmadnn (PID {pid}) is writing this folder now; wait for it, stop it, or use another --out"


def held_elsewhere(folder: Path, lock: Path, held: dict[str, Any], me: dict[str, Any]) -> str:
    """Why a lock taken on another host is not taken over, and the safe fix."""
    pid, host, job = held["pid"], held["host"], held.get("slurm_job")
    here = f" (this run is on {me['host']}" + (f" in Slurm job {me['slurm_job']}" if me.get("slurm_job") else "") + ")"
    if job is None:
        return f"{folder}: locked by a magmadnn on {host} (PID {pid}){here}; if it is no longer running, remove {lock}"
    said = f"{folder}: locked by a magmadnn on {host} (PID {pid}) in Slurm job {job}{here}"
    if job == me.get("slurm_job"):
        return (f"{said}: another step of this job at the same restart ({held.get('slurm_restart', 0)}), so not a "
                f"requeue; two runs must not write one folder: use another --out, or once that step has ended, "
                f"remove {lock}")
    return (f"{said}; if that job is no longer running (`squeue -j {job}` lists nothing), remove {lock}; else wait "
            "for it or use another --out")
