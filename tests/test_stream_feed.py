"""A streamed epoch's rows are gathered a chunk of whole updates at a time (about GATHER_BYTES of
rows, whatever their width), when it is drawn (issue 48, speed): neither an update at a time
(bookkeeping per step) nor a block's rows at once (memory); with the cache of encoded rows, no thread
reads ahead (its hand-offs cost the steps more
than a cached read). The weights are those of one process, gathered any way."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.data import stream, stream_prepare
from magmadnn_cli.training import stream_trainer
from test_stream_train import _config, _weights, _write


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(stream, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(stream_prepare, "BUFFER_ROWS", 128)


def test_rows_are_gathered_a_chunk_of_updates_at_a_time_and_nothing_cached_is_read_ahead(tmp_path, capsys,
                                                                                        monkeypatch, small_blocks):
    config = _config(tmp_path, _write(tmp_path, "csv"))
    widths: list[int] = []
    take, prefetcher = stream_trainer.OwnedRows.take, stream.Prefetcher
    monkeypatch.setattr(stream_trainer.OwnedRows, "take",
                        lambda self, k, row, mine, x, y: widths.append(x[:1].nbytes) or take(self, k, row, mine, x, y))
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "before")
    assert code == 0, out + err
    monkeypatch.setattr(stream_trainer, "GATHER_BYTES", 100 * widths[0])  # 3 updates of training.batch_size 32
    gathers: list[int] = []
    monkeypatch.setattr(stream_trainer.OwnedRows, "take",
                        lambda self, k, row, mine, x, y: gathers.append(len(k)) or take(self, k, row, mine, x, y))
    started = []
    monkeypatch.setattr(stream, "Prefetcher", lambda *a, **k: started.append(1) or prefetcher(*a, **k))
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "after")
    assert code == 0, out + err
    assert max(gathers) == 96 and len(gathers) < sum(gathers) / 32  # chunks of 3 updates: fewer gathers than updates
    assert len(started) == 1  # the fitting pass's reader ahead; epochs and evaluations read the cache
    before, after = _weights(tmp_path / "before"), _weights(tmp_path / "after")
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_an_error_gathering_ahead_is_raised_at_its_step_and_stops_the_threads(tmp_path, capsys, monkeypatch,
                                                                            small_blocks):
    config = _config(tmp_path, _write(tmp_path, "csv"))
    calls = []

    def failing(self, k, row, mine, x, y):
        calls.append(1)
        if len(calls) == 5:
            raise MemoryError("test")
        return take(self, k, row, mine, x, y)
    take = stream_trainer.OwnedRows.take
    monkeypatch.setattr(stream_trainer.OwnedRows, "take", failing)
    before = set(threading.enumerate())
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run")
    assert code != 0
    assert set(threading.enumerate()) <= before  # the batch thread and the block reader joined
