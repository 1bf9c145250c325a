"""Running out of memory while reading, encoding or streaming the data is a user's problem with a
fix, not a bug (issue 48): exit 2, what ran out, the memory budget, and what to change."""

from __future__ import annotations

import threading

import pytest

from conftest import run_cli
from magmadnn_cli.data import prepare as prepare_module
from magmadnn_cli.data import stream, stream_cache, stream_prepare
from test_stream_train import _config, _write


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(stream, "BLOCK_BYTES", 2000)
    monkeypatch.setattr(stream_prepare, "BUFFER_ROWS", 128)


def _fails_after(calls: int, real):
    """`real`, raising MemoryError from its `calls`-th call on (in whatever thread calls it)."""
    count = []

    def failing(*args, **kwargs):
        count.append(1)
        if len(count) >= calls:
            raise MemoryError()
        return real(*args, **kwargs)
    return failing


def _refused(capsys, config, tmp_path, *named):
    before = set(threading.enumerate())
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run")
    text = " ".join((out + err).split())
    assert code == 2, text
    assert "internal error" not in text and "Traceback" not in text
    assert "ran out of memory" in text and "available to this process" in text, text  # what, and the budget
    for words in named:
        assert words in text, (words, text)
    assert set(threading.enumerate()) <= before  # the threads reading ahead stopped
    return text


def test_a_streamed_epoch_that_runs_out_of_memory_names_the_budget_and_the_fix(tmp_path, capsys, monkeypatch,
                                                                              small_blocks):
    monkeypatch.setattr(stream_cache, "_read_at", _fails_after(12, stream_cache._read_at))  # in the epoch
    config = _config(tmp_path, _write(tmp_path, "csv"))
    _refused(capsys, config, tmp_path, "streaming epoch 1", "training.batch_size")


def test_the_fitting_pass_running_out_of_memory_is_named(tmp_path, capsys, monkeypatch, small_blocks):
    from magmadnn_cli.data import stream_fit  # (the fitting passes' module)
    monkeypatch.setattr(stream_fit, "encode_features", _fails_after(3, stream_fit.encode_features))
    config = _config(tmp_path, _write(tmp_path, "parquet"))
    _refused(capsys, config, tmp_path, "t.parquet", "row groups")


def test_reading_the_file_into_memory_names_data_stream_as_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(prepare_module, "encode_features", _fails_after(1, prepare_module.encode_features))
    config = _config(tmp_path, _write(tmp_path, "csv"), stream=False)
    _refused(capsys, config, tmp_path, "t.csv", "data.stream: true")
