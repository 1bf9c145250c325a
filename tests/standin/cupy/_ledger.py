"""The stand-in's ledger: what crossed the host boundary, what ran on the device, and where from."""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

PACKAGE = "magmadnn_cli"
BOUNDARY = "/core/backend.py"  # its to_host/to_device only carry a caller's transfer


def site() -> str:
    """The innermost frame in the package ('core/graph/nn.py:243'), else the innermost outside the stand-in."""
    frame = sys._getframe(1)
    fallback = None
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        if f"/{PACKAGE}/" in filename and not filename.endswith(BOUNDARY):
            return f"{filename.split(f'/{PACKAGE}/', 1)[1]}:{frame.f_lineno}"
        if fallback is None and "/standin/" not in filename:
            fallback = f"{filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "?"


class StandInError(TypeError):
    """What cupy would refuse (or a real GPU could not do), found by the strict stand-in."""


@dataclass
class Tally:
    """Counts over one watch: per call site, with the kind of each read and copy."""
    reads: Counter = field(default_factory=Counter)
    copies: Counter = field(default_factory=Counter)
    operations: int = 0
    new_buffers: int = 0
    new_bytes: int = 0
    violations: list = field(default_factory=list)


class Ledger:
    """Counts every read, copy and operation into each open watch."""

    def __init__(self) -> None:
        self.strict = True
        self.capturing = False  # a stream is capturing (cuda.Stream.begin_capture)
        self.watches: list[Tally] = []

    @contextmanager
    def watch(self) -> Iterator[Tally]:
        tally = Tally()
        self.watches.append(tally)
        try:
            yield tally
        finally:
            self.watches.remove(tally)

    def read(self, kind: str) -> None:
        where = site()
        if self.capturing:
            raise StandInError(f"a device-to-host read ({kind}) during stream capture at {where}: "
                               "a captured step cannot read device memory")
        for tally in self.watches:
            tally.reads[(where, kind)] += 1

    def copy(self, kind: str) -> None:
        where = site()
        if self.capturing:
            raise StandInError(f"a host-to-device copy ({kind}) during stream capture at {where}: "
                               "a captured step takes its inputs from static device buffers")
        for tally in self.watches:
            tally.copies[(where, kind)] += 1

    def operation(self, new_bytes: int) -> None:
        for tally in self.watches:
            tally.operations += 1
            if new_bytes:
                tally.new_buffers += 1
                tally.new_bytes += new_bytes

    def violation(self, what: str) -> None:
        where = site()
        for tally in self.watches:
            tally.violations.append((where, what))
        if self.strict:
            raise StandInError(f"{what} (at {where}); cupy refuses this")


LEDGER = Ledger()
