"""A process's life seen from outside: whether a process id still runs (and is the process that
started at a given time, not a reuse of its id), and a child that ends with its parent."""

from __future__ import annotations

import os
from pathlib import Path


def die_with_parent(sig: int, parent: int | None = None) -> None:
    """Have Linux send this process `sig` when its parent ends, even by SIGKILL (PR_SET_PDEATHSIG;
    elsewhere nothing); where `parent` is given and already gone (this process adopted by another),
    end now."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def alive(pid: int, started: int | None = None) -> bool:
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


def start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (None without /proc)."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None
