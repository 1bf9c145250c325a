"""The first decode of a folder (issue 46, last round item 4): decoding workers are forked where that
is safe (Linux, no other Python thread, no MPI in the process), so they start in milliseconds, not
the ~0.4 s a spawned worker takes to import, and pay for themselves on folders of a few thousand
small files; elsewhere they are spawned. The pixels are the same either way."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data import image_pool
from magmadnn_cli.data.readers import ReadSpec, read_table

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(4604)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def folder(root, per=100):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per):
            Image.fromarray(rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


def test_forked_where_safe_spawned_beside_threads_or_mpi(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert image_pool.start_method() == ("fork" if sys.platform == "linux" else "spawn")
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # a prefetch, server or reporter thread
    assert image_pool.start_method() == "spawn"
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())  # a rank: no fork under MPI
    assert image_pool.start_method() == "spawn"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_forked_and_spawned_workers_give_the_same_pixels(tmp_path, monkeypatch, method):
    if method == "fork" and sys.platform != "linux":
        pytest.skip("fork is used on Linux only")
    folder(tmp_path / "t")
    here = read_table(tmp_path / "t", ReadSpec(None, None, data=DataConfig(train="x", image={"workers": 1,
                                                                                             "cache": False})))
    monkeypatch.setattr(image_pool, "start_method", lambda: method)
    used = []
    real = image_pool.ProcessPoolExecutor
    monkeypatch.setattr(image_pool, "ProcessPoolExecutor",
                        lambda n, mp_context, **kw: (used.append(mp_context.get_start_method()),
                                                     real(n, mp_context=mp_context, **kw))[1])
    there = read_table(tmp_path / "t", ReadSpec(None, None, data=DataConfig(train="x", image={"workers": 2,
                                                                                              "cache": False})))
    assert used == [method]
    np.testing.assert_array_equal(here.x, there.x)


def test_forked_workers_start_for_a_folder_that_spawned_ones_would_not_pay_for(tmp_path, monkeypatch):
    """Default workers: forked ones start where decoding here would take longer than their small
    start-up cost; spawned ones only past a second."""
    assert image_pool.PARALLEL_AFTER_S["fork"] < image_pool.PARALLEL_AFTER_S["spawn"]
    folder(tmp_path / "t", per=100)
    monkeypatch.setattr(image_pool, "start_method", lambda: "fork")
    monkeypatch.setitem(image_pool.PARALLEL_AFTER_S, "fork", 0.0)  # any decoding here pays for them
    monkeypatch.setattr(image_pool.os, "sched_getaffinity", lambda pid: {0, 1})
    used = []
    real = image_pool.ProcessPoolExecutor
    monkeypatch.setattr(image_pool, "ProcessPoolExecutor",
                        lambda n, **kw: (used.append(n), real(n, **kw))[1])
    read_table(tmp_path / "t", ReadSpec(None, None, data=DataConfig(train="x", image={"cache": False})))
    assert used == [1]  # 2 cores: this process and one forked worker
