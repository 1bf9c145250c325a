"""A task run over a listing of files in spans, in this process and worker processes (a folder's
decoding and validate's checks): the first BLOCK files here, timing a file; the rest here alone where
workers would not pay for their start, else shared: the workers take spans from the start, this
process takes them off the end while it would otherwise wait, each span once, results in order (the
same results with any number of processes). Each worker is given the files and settings once, at its
start (a span is two numbers); a few spans a process, each short enough for progress lines and
Ctrl-C. Workers are forked where that is safe, else spawned."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextvars import ContextVar
from typing import Any, Callable, Iterator

from ..processes import die_with_parent
from . import image_decode

BLOCK = 64                # files the first task (which times a file) decodes, and each task without workers
SPANS_EACH = 16           # with workers: about this many spans a process, ...
SPAN_S = 0.25             # ... each at most this long to decode (the progress lines' and Ctrl-C's pace)
# default workers: started only where decoding the rest here would take longer than this; a forked worker
# starts in ~10 ms, a spawned one in 0.3-0.5 s (a fresh Python importing numpy and Pillow)
PARALLEL_AFTER_S = {"fork": 0.1, "spawn": 1.0}

_job: ContextVar[tuple] = ContextVar("image_job", default=())  # a worker's (task, files, extra), from _adopt


def start_method() -> str:
    """How decoding workers start: forked where that is safe (Linux, no other Python thread, no MPI in
    the process: a fork copies one thread, and MPI libraries refuse or break under it), else spawned."""
    safe = sys.platform == "linux" and threading.active_count() == 1 and "mpi4py.MPI" not in sys.modules
    return "fork" if safe else "spawn"


def in_blocks(task: Callable[..., Any], files: list[str], extra: tuple, workers: int | None) -> Iterator[Any]:
    """`task(start, paths, *extra)` over the files in spans, results in order, each with the number of
    files done so far (a progress count): the first BLOCK files here (they time a file), the rest here
    in blocks of BLOCK, or (`workers`, default every core, where the rest here would take longer than
    PARALLEL_AFTER_S for the start method) shared by this process and workers - 1 more (`_shared`).
    Close it (contextlib.closing) to stop the workers."""
    started = time.perf_counter()
    yield min(BLOCK, len(files)), task(0, files[:BLOCK], *extra)
    per_file, rest = (time.perf_counter() - started) / min(BLOCK, len(files)), len(files) - BLOCK
    count, method = min(workers or len(os.sched_getaffinity(0)), -(-rest // BLOCK)), start_method()
    if count <= 1 or not (per_file * rest > PARALLEL_AFTER_S[method] or workers):  # unset: where they pay
        yield from ((min(start + BLOCK, len(files)), task(start, files[start:start + BLOCK], *extra))
                    for start in range(BLOCK, len(files), BLOCK))
        return
    yield from _shared(spans_of(len(files), count, per_file), count - 1, method, (task, files, extra))


def spans_of(total: int, count: int, per_file: float) -> list[tuple[int, int]]:
    """The files after the first BLOCK in spans (start, stop) for `count` processes: about SPANS_EACH
    each (a process that finishes early takes another), none longer than SPAN_S to decode at
    `per_file` seconds a file; BLOCK files where the workers, going forward, meet this process, going
    back over the last 1/count of the files (if all go at one pace), growing away from there by a
    quarter of the distance (one shorter remainder at each far end). A worker holds up to two spans
    this process can no longer cancel, the one it runs and one queued, and this process waits for
    them at the end: short spans there keep that wait to milliseconds (full-size ones: two spans)."""
    size = max(BLOCK, min(-(-(total - BLOCK) // (count * SPANS_EACH)), int(SPAN_S / max(per_file, 1e-9))))
    meet = BLOCK + (total - BLOCK) * (count - 1) // count
    ahead, behind = _away(meet - BLOCK, size), _away(total - meet, size)
    edges = [meet - d for d in reversed(ahead)] + [meet] + [meet + d for d in behind]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _away(length: int, size: int) -> list[int]:
    """Distances from the meeting point of the span edges on one side `length` files long: spans of
    BLOCK files, then a quarter of the distance covered, up to `size`; the last one what is left."""
    edges, done = [], 0
    while done < length:
        done += min(max(BLOCK, done // 4), size, length - done)
        edges.append(done)
    return edges


def _shared(spans: list[tuple[int, int]], workers: int, method: str, job: tuple) -> Iterator[Any]:
    """`job`'s spans (task, files, extra: given to each worker once, at its start) decoded by `workers`
    processes from the first span on and by this one from the last span back, each span once (a span
    this process takes is cancelled in the pool first); results in order. Closing it cancels what the
    workers have not started and waits for what they have."""
    context = multiprocessing.get_context(method)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_adopt, initargs=(os.getpid(), *job))
    try:
        futures, done, last, count = [pool.submit(_span, *span) for span in spans], {}, len(spans) - 1, BLOCK
        for i, future in enumerate(futures):
            while i not in done and i <= last and not future.done() and futures[last].cancel():
                done[last], last = _span(*spans[last], job), last - 1  # idle here: take a span off the end
                count += spans[last + 1][1] - spans[last + 1][0]
            result = done.pop(i) if i in done else future.result()
            count += 0 if i > last else spans[i][1] - spans[i][0]  # a worker's (this process's are counted)
            yield count, result
    finally:
        pool.shutdown(cancel_futures=True)


def _adopt(parent: int, *job: Any) -> None:
    """A worker's start: it ends with the process that started it (killed, that process's lock on the
    cache would stay held by this worker, and later runs wait on it for ever); the job kept (its files
    sent once, not per span); Ctrl-C left to the command."""
    die_with_parent(signal.SIGKILL, parent)
    _job.set(job)
    image_decode.quiet_worker()


def _span(start: int, stop: int, job: tuple = ()) -> Any:
    """The job's task over files start:stop (in a worker: the job it was started with)."""
    task, files, extra = job or _job.get()
    return task(start, files[start:stop], *extra)
