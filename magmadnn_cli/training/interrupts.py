"""SIGINT/SIGTERM. During training the first one is only recorded, so the loop can finish its step,
write a checkpoint and exit cleanly; a second one stops at once (KeyboardInterrupt). A search stops
at once and keeps its finished trials (`Interruptible`)."""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While active (a context manager), `received` holds the first signal number caught (0: none)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.received = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if self.enabled:
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received:  # the second signal: the user means it
            self.__exit__()
            raise KeyboardInterrupt
        self.received = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""


class Interruptible(StopSignals):
    """While active, SIGINT and SIGTERM raise KeyboardInterrupt at once, for work that may stop
    anywhere (a search, between or inside trials); `received` holds the signal number."""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        raise KeyboardInterrupt


@contextlib.contextmanager
def ignoring_stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM ignored (a search's workers: the master stops the job)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resume_command(run_dir: Path, ranks: int = 1) -> str:
    """The command that continues this run: the one that started it, with `--resume RUN_DIR` (and
    `--processes N` for a data-parallel run, whatever launched it)."""
    args = sys.argv[1:]
    if not args or args[0] != "train":
        args = ["train", "CONFIG"]
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--resume", "-r", "--init-from", "--processes", "-n"):
            skip = True
        elif not arg.startswith(("--resume=", "--init-from=", "--processes=")):
            kept.append(arg)
    return shlex.join(["magmadnn", *kept, *(["--processes", str(ranks)] if ranks > 1 else []),
                       "--resume", str(run_dir)])
