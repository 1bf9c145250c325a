"""The collective timeout (`distributed.timeout`): a thread on every rank that ends the job when the
main thread has waited in one MPI call of the training loop longer than the timeout (a rank stopped or
frozen, a network split), or when a stop signal came while it waits and a rank no longer answers.

While the main thread waits inside MPI, Python cannot run its signal handlers, so the watchdog learns
of stop signals through `signal.set_wakeup_fd` (written by the C-level handler at once). Before
ending the job it asks every other rank's watchdog, on a communicator of its own, whether it is there
(ping, pong); the ranks that do not answer within ANSWER seconds are the ones named, with the hosts
every rank learnt when it joined. The lowest rank that answered says it, then MPI_Abort on COMM_WORLD
ends every process of the job (the launcher kills stopped ones too).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator

from mpi4py import MPI

from ..signals import WATCHED, meant
from .comm import wait_until_read
from .leftovers import unlink_own_segments

PING, PONG = 1, 2  # tags on the watchdog's own communicator
ANSWER = 2.0  # seconds a rank's watchdog has to answer a ping
SIGNAL_GRACE = 2.0  # after a stop signal, seconds a wait may last before the watchdog asks who is there
TICK = 0.1  # seconds between the watchdog's looks
STOPS = {int(sig) for sig in WATCHED}  # the stop signals (SIGINT, SIGTERM, Slurm's SIGUSR1; carriers)
TIMED_OUT = 1  # the exit code of a timeout (after a stop signal: 128 + the signal, as an interruption)


class Waits:
    """What the main thread waits for inside MPI now (None: nothing) and since when. The outermost
    wait names it (a training step's reduction holds the communicator's own calls)."""

    def __init__(self) -> None:
        self.what: str | None = None
        self.since = 0.0

    @contextlib.contextmanager
    def on(self, what: str) -> Iterator[None]:
        if self.what is not None:
            yield
            return
        self.since, self.what = time.monotonic(), what
        try:
            yield
        finally:
            self.what = None

    def waited(self) -> tuple[str, float] | None:
        what, since = self.what, self.since
        return None if what is None else (what, time.monotonic() - since)


class Watchdog(threading.Thread):
    """Started and stopped by `watching` (collective: every rank enters and leaves it together)."""

    def __init__(self, world: Any, timeout: float | None, resume_note: Callable[[], str | None]) -> None:
        super().__init__(name="magmadnn-watchdog", daemon=True)
        self.comm = world.comm.Dup()  # its own: pings never meet the training's messages
        world.owned.append(self.comm)  # freed with the others before MPI_Finalize (not here: a rank may be failing)
        self.waits, self.timeout, self.resume_note = world.waits, timeout, resume_note
        self.rank, self.size, self.hosts = world.rank, world.size, world.hosts
        self.can_ask = MPI.Query_thread() == MPI.THREAD_MULTIPLE  # else this thread must not call MPI but to abort
        self.done = threading.Event()
        self.signals: list[int] = []
        self.probed_after = 0  # the signal count of the last probe that found everyone there
        self.probes = 0  # pings carry their probe's number: a late answer never counts for a later probe
        self.wakeup, self.wakeup_end = socket.socketpair()
        for end in (self.wakeup, self.wakeup_end):
            end.setblocking(False)
        self.sent: list[Any] = []
        self.unanswered: list[Any] = world.unanswered  # the world's: sends outliving this watchdog

    def run(self) -> None:
        while not self.done.is_set():
            self._read_signals()
            self._answer()
            if (waited := self.waits.waited()) is not None and (why := self._why_end(*waited)):
                self._end(why, waited)

    def _read_signals(self) -> None:
        """Wait a tick for stop signals (their numbers, written by Python's C-level handler)."""
        if select.select([self.wakeup], [], [], TICK)[0]:
            with contextlib.suppress(BlockingIOError):
                self.signals += [meant(n) for n in self.wakeup.recv(64) if n in STOPS]

    def _answer(self) -> None:
        """Answer every ping: this rank is there (and whether it waits inside MPI)."""
        if not self.can_ask:
            return
        status = MPI.Status()
        while self.comm.Iprobe(MPI.ANY_SOURCE, PING, status):
            probe = self.comm.recv(source=status.Get_source(), tag=PING)
            self.sent.append(self.comm.isend((probe, self.waits.waited()), dest=status.Get_source(), tag=PONG))
        self.sent = [r for r in self.sent if not r.Test()]

    def _why_end(self, what: str, waited: float) -> str | None:
        """Why the job must end now (None: wait on)."""
        me = f"rank {self.rank} on {self.hosts[self.rank]}"
        if self.timeout and waited > self.timeout:
            return f"{me} waited {waited:.0f} s in {what}, longer than distributed.timeout ({self.timeout:g} s)"
        name = signal.Signals(self.signals[-1]).name if self.signals else ""
        if len(self.signals) >= 2:
            return f"{name} came twice while {me} waited {waited:.0f} s in {what}"
        if self.signals and self.probed_after < len(self.signals) and waited > SIGNAL_GRACE:
            self.probed_after = len(self.signals)
            if self._probe()[0]:
                return f"{name} came while {me} waited {waited:.0f} s in {what}"
        return None

    def _probe(self) -> tuple[list[int], dict[int, Any]]:
        """Ping every other rank; (the ranks that did not answer within ANSWER s, the others' answers)."""
        others = [r for r in range(self.size) if r != self.rank]
        if not self.can_ask:
            return [], {}
        self.probes += 1
        pings = [self.comm.isend(self.probes, dest=r, tag=PING) for r in others]
        answers: dict[int, Any] = {}
        status, deadline = MPI.Status(), time.monotonic() + ANSWER
        while len(answers) < len(others) and time.monotonic() < deadline:
            self._answer()
            while self.comm.Iprobe(MPI.ANY_SOURCE, PONG, status):
                probe, waited = self.comm.recv(source=status.Get_source(), tag=PONG)
                if probe == self.probes:
                    answers[status.Get_source()] = waited
            time.sleep(0.01)
        self.sent += pings
        return [r for r in others if r not in answers], answers

    def _end(self, why: str, waited: tuple[str, float]) -> None:
        """Name who stopped answering, and the last checkpoint; then end every process of the job."""
        silent, answers = self._probe()
        if min({self.rank, *answers}) != self.rank:
            time.sleep(ANSWER)  # the speaker says it and ends the job, which ends this process too...
        # ...unless it cannot, or has not timed out yet (it may have joined the wait late: a rank
        # writing a checkpoint); still here, this rank says it
        os.write(2, ("error: " + self._message(why, silent, answers) + "\n").encode())
        wait_until_read(sys.stderr)  # the launcher drops what it has not read once the job aborts
        # COMM_WORLD's abort ends the job; MPICH ends only this process on any other communicator (our
        # Dup), and a rank on another host, stopped or stuck, would run on forever
        unlink_own_segments()  # MPI_Abort skips MPI_Finalize, which would unlink them
        with contextlib.suppress(MPI.Exception):
            MPI.COMM_WORLD.Abort(128 + self.signals[-1] if self.signals else TIMED_OUT)
        # MPI_Abort returns when the launcher cannot be reached (a host cut off by the network); a rank
        # killed by a signal makes its host's launcher proxy kill the others there, stopped ones too
        os.kill(os.getpid(), signal.SIGKILL)

    def _message(self, why: str, silent: list[int], answers: dict[int, Any]) -> str:
        busy = [r for r, wait in answers.items() if wait is None]  # answered, but not inside MPI
        if silent:
            who = f"{self._ranks(silent)} stopped answering (stopped, frozen, or cut off by the network)"
        elif busy:
            who = f"{self._ranks(busy)} answered but never joined the collective (busy or stuck outside MPI)"
        elif not self.can_ask:
            who = "which rank stopped is not known (this MPI gives threads no access: no MPI_THREAD_MULTIPLE)"
        else:
            who = "every rank answers and waits: they wait in different collectives (a bug: please report it)"
        resume = self.resume_note() or "no checkpoint was written"
        longer = "; if a rank may rightly wait longer, raise distributed.timeout (seconds; 0: no limit)"
        return f"the job is ended: {why}; {who}{longer if not self.signals else ''}\n{resume}"

    def _ranks(self, ranks: list[int]) -> str:
        return ", ".join(f"rank {r} on {self.hosts[r]}" for r in ranks)

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.unanswered.extend(r for r in self.sent if not r.Test())  # their buffers live until MPI sends them
        self.wakeup.close()
        self.wakeup_end.close()


@contextlib.contextmanager
def watching(world: Any, timeout: float | None, resume_note: Callable[[], str | None]) -> Iterator[None]:
    """The watchdog over `world` (the MPICommunicator of the job) for the `with` block; entered by
    every rank together. Without a timeout it still ends a job stuck when a stop signal came."""
    dog = Watchdog(world, timeout, resume_note)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.set_wakeup_fd(dog.wakeup_end.fileno(), warn_on_full_buffer=False) if main else -1
    dog.start()
    try:
        yield
    finally:
        dog.stop()
        if main:
            signal.set_wakeup_fd(previous)
