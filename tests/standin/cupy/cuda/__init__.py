"""cupy.cuda in the stand-in: one device, a memory pool, streams and CUDA-graph capture.

Work is queued on the current stream (`with stream:`); the legacy default stream (`Stream.null`) cannot
capture, and work issued on it while another stream captures is refused, as on a real device. A capture
records each operation with the buffers it read and wrote; `Graph.launch` runs them again on the same
buffers, with every host value frozen as it was at capture (a real graph's semantics). Captured work
is not run: the stand-in runs it to learn its results' shapes, then puts back every buffer that existed
before the capture (the graph's own new buffers keep what they hold, as undefined as on a device)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as _np

from .._ledger import LEDGER, StandInError, site
from . import runtime


class Device:
    def __init__(self, device: int = 0) -> None:
        self.id = device

    def use(self) -> None:
        if not 0 <= self.id < runtime.getDeviceCount():
            raise StandInError(f"no device {self.id}")

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class Event:
    """A CUDA event (the stand-in's work is done when issued: nothing to wait for)."""

    def synchronize(self) -> None:
        if LEDGER.capturing:
            raise StandInError("an event waited for during a capture")


class Graph:
    """A captured sequence of operations, replayed on the buffers it was captured with."""

    def __init__(self, tape: list) -> None:
        self.tape = tape

    def launch(self, stream: Any = None) -> None:
        from .. import unwrap

        for entry in self.tape:
            if callable(entry):  # work enqueued by a library (NCCL)
                entry()
                continue
            fn, args, kwargs, result = entry
            out = fn(*unwrap(args), **unwrap(kwargs))
            _write_back(out, result)
            LEDGER.operation(0)

    def upload(self, stream: Any = None) -> None:
        pass


def _write_back(out: Any, result: Any) -> None:
    """Put a replayed operation's output into the buffer the capture gave it."""
    from .. import ndarray

    if isinstance(result, tuple):
        for o, r in zip(out, result):
            _write_back(o, r)
    elif isinstance(result, ndarray) and isinstance(out, (_np.ndarray, _np.generic)) and out is not result._a:
        if result._a.flags.writeable and not _np.may_share_memory(out, result._a):
            result._a[...] = out  # (a view recomputed is the same memory: nothing to write)


class Stream:
    """A CUDA stream; `Stream.null` is the legacy default stream."""
    null: "Stream"
    _current: list["Stream"] = []

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        self.is_legacy = null
        self.ptr = 0 if null else id(self)
        self.tape: list | None = None
        self.saved: dict[int, tuple[_np.ndarray, _np.ndarray]] = {}  # memory older than the capture
        self.fresh: dict[int, _np.ndarray] = {}  # memory the capture allocated

    def __enter__(self) -> "Stream":
        Stream._current.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        Stream._current.pop()

    def use(self) -> "Stream":
        Stream._current[:] = [self]
        return self

    def synchronize(self) -> None:
        if self.is_capturing():
            raise StandInError("synchronize() on a capturing stream")

    def record(self, event: Any = None) -> "Event":
        if LEDGER.capturing and self.tape is None:
            raise StandInError("an event recorded on another stream during a capture")
        return event or Event()

    def wait_event(self, event: "Event") -> None:
        pass

    def begin_capture(self, mode: Any = None) -> None:
        if self.is_legacy:
            raise StandInError("cudaErrorStreamCaptureUnsupported: the legacy default stream cannot be captured; "
                               "run the step on a created stream")
        if LEDGER.capturing:
            raise StandInError("a capture is already in progress")
        self.tape, self.saved, self.fresh, LEDGER.capturing = [], {}, {}, True

    def end_capture(self) -> Graph:
        if self.tape is None:
            raise StandInError("end_capture without begin_capture")
        for root, old in self.saved.values():
            root[...] = old  # captured work did not run
        for root in self.fresh.values():
            if root.dtype.kind == "f" and root.flags.writeable:
                root[...] = _np.nan  # what the graph's own buffers hold before a launch: nothing defined
        graph, self.tape, LEDGER.capturing = Graph(self.tape), None, False
        self.saved, self.fresh = {}, {}
        return graph

    def is_capturing(self) -> bool:
        return self.tape is not None


Stream.null = Stream(null=True)


def enqueue(work: Callable[[], None]) -> None:
    """A library's device work (NCCL's collectives): run now, or recorded by a capturing stream."""
    if not LEDGER.capturing:
        work()
        return
    stream = get_current_stream()
    if stream.tape is None:
        raise StandInError(f"library work issued outside the capturing stream (at {site()})")
    stream.tape.append(work)


def get_current_stream() -> Stream:
    return Stream._current[-1] if Stream._current else Stream.null


def _root(a: _np.ndarray) -> _np.ndarray:
    while isinstance(a.base, _np.ndarray):
        a = a.base
    return a


def _arrays(values: Any) -> list:
    from .. import ndarray

    found = []
    for v in values:
        if isinstance(v, ndarray):
            found.append(v._a)
        elif isinstance(v, (tuple, list)):
            found += _arrays(v)
        elif isinstance(v, dict):
            found += _arrays(v.values())
    return found


def before(args: tuple, kwargs: dict) -> None:
    """Before an operation during capture: keep the contents of the older memory it may change."""
    if not LEDGER.capturing:
        return
    stream = get_current_stream()
    if stream.tape is None:
        return  # refused by `record`
    for a in _arrays((*args, *kwargs.values())):
        root = _root(a)
        if id(root) not in stream.fresh and id(root) not in stream.saved:
            stream.saved[id(root)] = (root, root.copy())


def record(fn: Callable, args: tuple, kwargs: dict, result: Any) -> None:
    """Called for every device operation: appended to the tape of a capturing current stream."""
    if not LEDGER.capturing:
        return
    stream = get_current_stream()
    if stream.tape is None:
        raise StandInError(f"work issued on {'the legacy default stream' if stream.is_legacy else 'another stream'} "
                           f"while a stream captures (at {site()}): cudaErrorStreamCaptureImplicit")
    stream.tape.append((fn, args, kwargs, result))
    for a in _arrays(result if isinstance(result, (tuple, list)) else (result,)):
        root = _root(a)
        if id(root) not in stream.saved:
            stream.fresh[id(root)] = root


class MemoryPool:
    def __init__(self, allocator: Any = None) -> None:
        self.allocator = allocator

    def malloc(self, size: int) -> None:
        return None

    def free_bytes(self) -> int:
        return 0

    def used_bytes(self) -> int:
        return 0

    def total_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        pass


DEFAULT_POOL = MemoryPool()


_ALLOCATOR: list = [DEFAULT_POOL.malloc]


def get_allocator() -> Any:
    return _ALLOCATOR[-1]


class using_allocator:
    """The stand-in allocates through numpy; the allocator is kept for code that asks for it."""
    def __init__(self, allocator: Any = None) -> None:
        self.allocator = allocator

    def __enter__(self) -> None:
        _ALLOCATOR.append(self.allocator)

    def __exit__(self, *exc: Any) -> None:
        _ALLOCATOR.pop()


def malloc_managed(size: int) -> None:
    return None


def set_allocator(allocator: Any = None) -> None:
    pass
