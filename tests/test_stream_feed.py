"""A streamed epoch's rows are gathered batch by batch, ahead of the step, in the background (issue
48, speed), as the in-memory path gathers its batches (`training/batches.Prefetch`): the main thread
only exchanges rows and steps. The weights are those of one process, gathered any way."""

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


def test_rows_are_gathered_a_batch_at_a_time_off_the_main_thread(tmp_path, capsys, monkeypatch, small_blocks):
    config = _config(tmp_path, _write(tmp_path, "csv"))
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "before")
    assert code == 0, out + err
    gathers: list[tuple[int, bool]] = []
    take = stream_trainer.OwnedRows.take

    def counted(self, k, row, mine, x, y):
        gathers.append((len(k), threading.current_thread() is threading.main_thread()))
        return take(self, k, row, mine, x, y)
    monkeypatch.setattr(stream_trainer.OwnedRows, "take", counted)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "after")
    assert code == 0, out + err
    assert gathers and max(n for n, _ in gathers) <= 32  # training.batch_size: no piece gathered whole
    assert not any(main for _, main in gathers)  # drawn ahead by the batch thread
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
