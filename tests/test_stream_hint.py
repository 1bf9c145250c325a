"""Cached blocks asked of the kernel ahead (issue 48, the 10 GB run's slower epochs): a big table's cache
of encoded rows outgrows the page cache, so an epoch's reads of it went to the disk while the steps
waited. Each pass over cached blocks now asks the kernel (posix_fadvise WILLNEED) for the next block's
bytes before reading the current one: the disk reads overlap the steps, the rows and weights unchanged."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.data import stream, stream_cache
from test_stream_cache import small_blocks  # noqa: F401  (fixture)
from test_stream_train import _config, _weights, _write


def test_a_cache_asks_the_kernel_for_one_entrys_bytes(tmp_path, monkeypatch):
    cache = stream_cache.EncodedBlocks(str(tmp_path))
    x, y = np.ones((5, 3), np.float32), np.arange(5, dtype=np.uint8)
    cache.put("a", x, y), cache.put("b", 2 * x, y)
    asked = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, size, advice: asked.append((offset, size, advice)))
    cache.will_need("b"), cache.will_need("missing")
    assert asked == [(x.nbytes + y.nbytes, x.nbytes + y.nbytes, os.POSIX_FADV_WILLNEED)]
    joined = stream_cache.JoinedBlocks([stream_cache.EncodedBlocks(str(tmp_path)), cache])
    asked.clear()
    joined.will_need("a")
    assert asked == [(0, x.nbytes + y.nbytes, os.POSIX_FADV_WILLNEED)]


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_each_cached_read_was_asked_for_ahead_and_the_weights_are_unchanged(tmp_path, capsys, monkeypatch,
                                                                           small_blocks, kind):  # noqa: F811
    config = _config(tmp_path, _write(tmp_path, kind))
    events: list[tuple[str, object]] = []
    get, hint = stream_cache.EncodedBlocks.get, stream_cache.EncodedBlocks.will_need
    monkeypatch.setattr(stream_cache.EncodedBlocks, "get", lambda self, key: events.append(("read", key)) or get(self, key))
    monkeypatch.setattr(stream_cache.EncodedBlocks, "will_need",
                        lambda self, key: events.append(("hint", key)) or hint(self, key))
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "hinted")
    assert code == 0, out + err
    reads = [key for what, key in events if what == "read"]
    assert len(reads) > 10
    for at, (what, key) in enumerate(events):  # every epoch's cached read was asked for before it
        if what == "read" and key[1] == stream.TRAIN:
            assert ("hint", key) in events[:at], key
    monkeypatch.setattr(stream_cache.EncodedBlocks, "will_need", lambda self, key: None)
    assert run_cli(capsys, "train", config, "--out", tmp_path / "plain")[0] == 0
    hinted, plain = _weights(tmp_path / "hinted"), _weights(tmp_path / "plain")
    assert hinted.keys() == plain.keys() and all(np.array_equal(hinted[k], plain[k]) for k in hinted)
