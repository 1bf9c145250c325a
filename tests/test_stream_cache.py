"""Streamed epochs read encoded rows back from a cache (issue 48, speed): the fitting pass, which
encodes every block anyway, keeps each block's encoded features and targets in an unlinked file in
TMPDIR; epochs and evaluations read them back instead of parsing and encoding the file again. The
weights are bitwise those of a run without the cache."""

from __future__ import annotations

import collections
import errno
import json
import pickle

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.data import stream, stream_cache, stream_prepare
from test_stream_train import _config, _target_file, _task_config, _weights, _write


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(stream, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(stream_prepare, "BUFFER_ROWS", 128)


def _reads(monkeypatch) -> collections.Counter:
    """How often each block (by its first row) is parsed from the file."""
    counts: collections.Counter = collections.Counter()
    table = stream.BlockFile._table
    monkeypatch.setattr(stream.BlockFile, "_table", lambda self, t, first: counts.update([first]) or table(self, t, first))
    return counts


def _scores(run) -> dict:
    """metrics.json without its timings."""
    def timeless(value):
        if isinstance(value, dict):
            return {k: timeless(v) for k, v in value.items() if "time" not in k and "seconds" not in k}
        return value
    return timeless(json.loads((run / "metrics.json").read_text()))


@pytest.mark.parametrize("kind", ["csv", "parquet", "jsonl"])
def test_epochs_read_the_cache_not_the_file_and_train_the_same_weights(tmp_path, capsys, monkeypatch, small_blocks,
                                                                      kind):
    config = _config(tmp_path, _write(tmp_path, kind))
    reads = _reads(monkeypatch)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "cached")
    assert code == 0, out + err
    assert len(reads) > 5 and set(reads.values()) == {2}  # the survey and the fitting pass; no epoch, no evaluation
    monkeypatch.setattr(stream_cache, "room_for", lambda nbytes, folder=None: False)
    reads.clear()
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "file")
    assert code == 0, out + err
    assert min(reads.values()) > 2  # without the cache: each epoch parses the file again
    cached, parsed = _weights(tmp_path / "cached"), _weights(tmp_path / "file")
    assert cached.keys() == parsed.keys() and all(np.array_equal(cached[k], parsed[k]) for k in cached)
    assert _scores(tmp_path / "cached") == _scores(tmp_path / "file")


@pytest.mark.parametrize("task", ["regression", "multilabel"])
def test_regression_and_multilabel_targets_from_the_cache_are_the_files(tmp_path, capsys, monkeypatch, small_blocks,
                                                                       task):
    data, _ = _target_file(tmp_path, task)
    path = _task_config(tmp_path, data, task)
    assert run_cli(capsys, "train", path, "--out", tmp_path / "cached")[0] == 0
    monkeypatch.setattr(stream_cache, "room_for", lambda nbytes, folder=None: False)
    assert run_cli(capsys, "train", path, "--out", tmp_path / "file")[0] == 0
    cached, parsed = _weights(tmp_path / "cached"), _weights(tmp_path / "file")
    assert all(np.array_equal(cached[k], parsed[k]) for k in cached)
    assert _scores(tmp_path / "cached") == _scores(tmp_path / "file")


def test_a_cache_gives_back_each_blocks_arrays_and_travels_to_a_process_on_the_same_host(tmp_path, monkeypatch):
    cache = stream_cache.EncodedBlocks(str(tmp_path))
    blocks = [(stream.Block(0, 10, 0, 3), 0), (stream.Block(10, 20, 3, 2), 0), (stream.Block(10, 20, 3, 2), 1)]
    arrays = [(np.arange(12, dtype=np.float32).reshape(3, 4), np.array([0, 1, 1], np.uint8)),
              (np.full((2, 4), -1.5, np.float32), np.array([[1.0, 0.0], [0.0, 1.0]])),
              (np.empty((0, 4), np.float32), np.empty((0, 2)))]  # a block without rows of a split
    for block, (x, y) in zip(blocks, arrays):
        cache.put(block, x, y)
    assert list(tmp_path.iterdir()) == []  # unlinked: nothing is left behind, whatever ends the process
    copy = pickle.loads(pickle.dumps(cache))  # what a node's other ranks receive (distributed/shared.py)
    for reader in (cache, copy):
        for block, (x, y) in zip(blocks, arrays):
            got = reader.get(block)
            assert got is not None and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got, (x, y)))
        assert reader.get((stream.Block(20, 30, 5, 1), 0)) is None
    sent = pickle.dumps(cache)
    monkeypatch.setattr(stream_cache.socket, "gethostname", lambda: "another-node")
    assert pickle.loads(sent).get(blocks[0]) is None  # on another host: the file is read instead


def test_no_cache_where_the_temporary_folder_is_memory_or_lacks_room(tmp_path, monkeypatch):
    assert stream_cache.file_system("/proc") == "proc"  # read from /proc/mounts
    assert stream_cache.room_for(1 << 20, str(tmp_path))
    assert not stream_cache.room_for(1 << 62, str(tmp_path))
    monkeypatch.setattr(stream_cache, "file_system", lambda folder: "tmpfs")  # RAM: the cache would eat memory
    assert not stream_cache.room_for(1 << 20, str(tmp_path))


def test_a_disk_that_fills_or_a_temporary_folder_that_fails_leaves_the_run_parsing_the_file(tmp_path, capsys,
                                                                                          monkeypatch, small_blocks):
    config = _config(tmp_path, _write(tmp_path, "csv"))
    written, write = [], stream_cache._write_at

    def filling(fd, array, offset):
        written.append(1)
        if len(written) > 6:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, array, offset)

    def unwritable(*args):
        raise PermissionError(errno.EACCES, "Permission denied")
    for run, name, change in (("file", "room_for", lambda nbytes, folder=None: False),
                              ("full", "_write_at", filling), ("no_folder", "EncodedBlocks", unwritable)):
        with monkeypatch.context() as patched:
            patched.setattr(stream_cache, name, change)
            code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / run)
            assert code == 0, out + err
    assert len(written) > 6
    for run in ("full", "no_folder"):
        got, parsed = _weights(tmp_path / run), _weights(tmp_path / "file")
        assert all(np.array_equal(got[k], parsed[k]) for k in parsed), run


def test_a_cache_unreadable_where_it_is_unpickled_claims_no_blocks(tmp_path, monkeypatch):
    """On another host (or once its writer is gone) a rank's cache holds nothing it could read: it claims
    no blocks, so a pass reads those blocks from the file (ahead, in the background) instead of
    expecting the cache to give them."""
    cache = stream_cache.EncodedBlocks(str(tmp_path))
    cache.put("block", np.ones((3, 2), np.float32), np.zeros(3, np.uint8))
    here = pickle.loads(pickle.dumps(cache))
    assert "block" in here.entries and here.get("block") is not None
    state = cache.__getstate__()
    elsewhere = stream_cache.EncodedBlocks.__new__(stream_cache.EncodedBlocks)
    elsewhere.__setstate__({**state, "host": "another-host"})
    assert not elsewhere.entries and elsewhere.get("block") is None
    gone = stream_cache.EncodedBlocks.__new__(stream_cache.EncodedBlocks)
    gone.__setstate__({**state, "path": str(tmp_path / "no-such-file")})
    assert not gone.entries and gone.get("block") is None
