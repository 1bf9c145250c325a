"""Stop signals (SIGINT, SIGTERM, and SIGUSR1: Slurm's warning before a time limit, to checkpoint
and exit for requeue), one owner for the process. While a command runs (`watching`),
the first one is recorded and raised at once as KeyboardInterrupt. numpy and pyarrow can turn that
exception into another (numpy 2's string ufuncs re-raise it as a TypeError) or a reader can take it
for bad input and fall back, so readers `check()` where they fall back and the CLI reports any
ending after a signal as the interruption it was. Inside, training records the first signal only,
so the loop can finish its step, write a checkpoint and exit cleanly, and a second one stops at once
(`StopSignals`); a search stops at once and keeps its finished trials (`Interruptible`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)  # SIGUSR1: Slurm's warning before the time limit

# Open MPI's mpirun SIGKILLs the ranks about 0.2 s after passing on a SIGINT or SIGTERM (too soon for a
# checkpoint), but passes SIGUSR2 and SIGALRM on and waits: the `--processes` launcher sends a stop
# signal to it as its carrier, and tells the ranks (RELAY_VARIABLE) which signal each carrier means.
CARRIERS = {signal.SIGINT: signal.SIGUSR2, signal.SIGTERM: signal.SIGALRM}
RELAY_VARIABLE = "MAGMADNN_RELAYED_SIGNALS"


def relay_text(carriers: dict[signal.Signals, signal.Signals]) -> str:
    """What RELAY_VARIABLE holds: "SIGUSR2:SIGINT,SIGALRM:SIGTERM" (carrier:meant)."""
    return ",".join(f"{carrier.name}:{stop.name}" for stop, carrier in carriers.items())


def _relayed(text: str) -> dict[int, int]:
    """carrier -> the stop signal it means, from `relay_text`'s form; only CARRIERS' carriers and
    stop signals count (a hand-set value naming others is ignored)."""
    pairs = [part.split(":") for part in text.split(",") if part.count(":") == 1]
    carriers, stops = {s.name: s for s in CARRIERS.values()}, {s.name: s for s in SIGNALS}
    return {int(carriers[c]): int(stops[m]) for c, m in pairs if c in carriers and m in stops}


RELAYED = _relayed(os.environ.get(RELAY_VARIABLE, ""))
WATCHED = SIGNALS + tuple(signal.Signals(c) for c in RELAYED)  # what this process takes as a stop signal


def meant(signum: int) -> int:
    """The stop signal that `signum` stands for (itself, or what its carrier means)."""
    return RELAYED.get(signum, signum)


class StopSignals:
    """While active (a context manager), `received` holds the first signal number caught (0: none)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.received = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if self.enabled:
            for sig in WATCHED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received:  # the second signal: the user means it
            self.__exit__()
            _stop_now(signum, frame)
        self.received = meant(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""


class Interruptible(StopSignals):
    """While active, SIGINT and SIGTERM raise KeyboardInterrupt at once, for work that may stop
    anywhere (a search, between or inside trials); `received` holds the signal number."""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = meant(signum)
        _stop_now(signum, frame)


@contextlib.contextmanager
def ignoring_stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM ignored (a search's workers: the master stops the job)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in WATCHED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Stops:
    """This process's stop signals (signal handlers are per process): the running command's first one,
    the `held` sections open now, and the signal that came inside one (0: none)."""

    def __init__(self) -> None:
        self.received = 0
        self.holding = 0
        self.held = 0

    def record(self, signum: int) -> None:
        self.received = self.received or signum


_STOPS = _Stops()


def record(signum: int) -> None:
    """Note a stop signal for the command (the first one counts)."""
    _STOPS.record(signum)


def received() -> int:
    """The command's first stop signal, 0 if none came."""
    return _STOPS.received


def check() -> None:
    """Raise KeyboardInterrupt if a stop signal came, in case its exception was turned into another."""
    if _STOPS.received:
        raise KeyboardInterrupt


def _stop_now(signum: int, frame: FrameType | None) -> None:
    signum = meant(signum)
    _STOPS.record(signum)
    if _STOPS.holding:
        _STOPS.held = signum
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A stop signal that comes inside waits for its end, then raises as usual: for the few steps
    between creating a file and knowing its name (so that it can be removed)."""
    _STOPS.holding += 1
    try:
        yield
    finally:
        _STOPS.holding -= 1
        came = _STOPS.held if not _STOPS.holding else 0
        _STOPS.held -= came  # the outermost section takes it (raised below, or the body's error wins)
    if came:
        raise KeyboardInterrupt


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """While a command runs: a stop signal is recorded and raised (a signal the command was started
    ignoring, as under nohup or in a background job, stays ignored); cleared after."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.getsignal(sig) for sig in WATCHED}
        for sig, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(sig, _stop_now)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        _STOPS.received = 0
