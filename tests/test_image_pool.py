"""The decoding pool of a folder's first read (issue 46, the last goal): this process decodes a share
(spans taken off the end while the workers take them from the start, each span once), workers - 1
more processes are started, each given the files once (a task is two numbers), a few spans a
process sized to the per-file time; results in order, and closing (Ctrl-C) stops the workers."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys

import numpy as np
import pytest

from magmadnn_cli.data import image_pool

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forked workers (the events are inherited)")
MAIN = os.getpid()
started = multiprocessing.get_context("fork").Event()  # set once a worker has started a span
stolen = multiprocessing.get_context("fork").Event()  # set once this process has taken a span off the end


def recorded(start: int, paths: list[str], tag: str) -> tuple[int, int, int, str]:
    """A task: who ran which files. A worker's span waits until this process has taken one off the
    end, and that one until a worker has started: both decode a share, whatever the machine's speed."""
    if os.getpid() != MAIN:
        started.set()
        assert stolen.wait(20)
    elif start >= image_pool.BLOCK:
        assert started.wait(20)
        stolen.set()
    return os.getpid(), start, len(paths), tag


@pytest.fixture
def pools(monkeypatch):
    """Every pool started (its size) and every task handed to one (its arguments); forked workers."""
    started.clear()
    stolen.clear()
    sizes, tasks = [], []
    real = image_pool.ProcessPoolExecutor

    def pool(n, **kw):
        executor = real(n, **kw)
        submit = executor.submit
        executor.submit = lambda fn, *args: (tasks.append(args), submit(fn, *args))[1]
        sizes.append(n)
        return executor
    monkeypatch.setattr(image_pool, "ProcessPoolExecutor", pool)
    monkeypatch.setattr(image_pool, "start_method", lambda: "fork")
    return sizes, tasks


def test_this_process_decodes_a_share_beside_workers_minus_one(pools):
    sizes, tasks = pools
    files = [f"f{i}.png" for i in range(2000)]
    with contextlib.closing(image_pool.in_blocks(recorded, files, ("x",), 3)) as results:
        counts, out = zip(*results)
    assert sizes == [2]  # 3 decoding processes: this one and 2 workers
    assert [start for _, start, _, _ in out] == sorted(start for _, start, _, _ in out)  # in order
    starts = np.cumsum([0] + [n for _, _, n, _ in out])
    assert [start for _, start, _, _ in out] == list(starts[:-1]) and starts[-1] == len(files)  # each file once
    assert all(tag == "x" for *_, tag in out)
    pids = {pid for pid, *_ in out}
    assert MAIN in pids and len(pids) >= 2
    assert sum(n for pid, start, n, _ in out if pid == MAIN and start) > 0  # a span taken off the end here
    assert all(len(args) == 2 and all(isinstance(a, int) for a in args) for args in tasks)  # no files per task
    # the progress count: every file done so far, here or in a worker, in order or not
    assert list(counts) == sorted(counts) and counts[-1] == len(files)
    assert out[1][0] != MAIN and counts[1] > out[1][1] + out[1][2]  # the span taken here before the worker's first


def test_spans_are_a_few_a_process_and_short_enough_for_progress():
    block = image_pool.BLOCK
    spans = image_pool.spans_of(10_000, 2, 40e-6)
    assert spans[0][0] == block and spans[-1][1] == 10_000
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert 2 * image_pool.SPANS_EACH <= len(spans) <= 3 * image_pool.SPANS_EACH  # and the short ones
    huge = image_pool.spans_of(1_000_000, 2, 40e-6)
    assert max(b - a for a, b in huge) * 40e-6 <= image_pool.SPAN_S  # a progress line at least this often
    assert all(b - a >= block for a, b in image_pool.spans_of(300, 8, 40e-6)[1:-1])  # a remainder at each end


@pytest.mark.parametrize("total, count", [(10_000, 2), (1_000_000, 2), (200_000, 16), (5_000, 3)])
def test_spans_shrink_where_this_process_meets_the_workers(total, count):
    """Spans are short where this process (taking the last share, 1/count of the files, from the end)
    meets the workers (taking the rest from the start): a worker holds up to two spans this process
    can no longer cancel (the one it runs and one queued), and this process waits for them once it
    runs out, so those must be short; the first spans are full size (few tasks)."""
    block, spans = image_pool.BLOCK, image_pool.spans_of(total, count, 40e-6)
    meet = block + (total - block) * (count - 1) // count
    at = next(i for i, (a, b) in enumerate(spans) if b >= meet)
    assert all(b - a <= 2 * block for a, b in spans[max(at - 2, 0):at + 3])
    assert spans[1][1] - spans[1][0] == spans[-2][1] - spans[-2][0] == max(b - a for a, b in spans) > block


def test_closing_stops_the_workers(pools):
    """Closed after the first results (Ctrl-C in the command), no worker is left."""
    files = [f"f{i}.png" for i in range(3000)]
    results = image_pool.in_blocks(recorded, files, ("x",), 2)
    seen = [next(results), next(results)]
    with contextlib.closing(results):
        seen.append(next(results))
    workers = {pid for _, (pid, *_) in seen} - {MAIN}
    assert workers
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # exited and reaped


def test_an_interrupt_while_this_process_decodes_stops_the_workers(pools, monkeypatch):
    pids = []

    def interrupted(start, paths, tag):
        pid, *rest = recorded(start, paths, tag)
        pids.append(pid)
        if pid == MAIN and start >= image_pool.BLOCK:
            raise KeyboardInterrupt
        return (pid, *rest)
    files = [f"f{i}.png" for i in range(3000)]
    with pytest.raises(KeyboardInterrupt):
        with contextlib.closing(image_pool.in_blocks(interrupted, files, ("x",), 2)) as results:
            list(results)
    assert pids.count(MAIN) == 2  # the first block, then the span it was taking when interrupted
    assert multiprocessing.active_children() == []
