"""An OSError while a streamed run reads its blocks (issue 48): counting a text block's lines, reading
its bytes, reading a Parquet row group. It is a DataError naming the file, the byte range or row
group and the OS's reason, with a fix; on several ranks every rank raises the same message together
(no rank waits for one that failed, no MPI abort); through the CLI, exit 2 and no traceback."""

from __future__ import annotations

import builtins
import errno
import os
import threading

import pytest

from conftest import run_cli
from magmadnn_cli.data import stream
from magmadnn_cli.distributed.stream_ranks import fit_ranks
from magmadnn_cli.errors import MagmaError
from test_stream_train import _config, _write, small_blocks  # noqa: F401  (a fixture)

EIO = os.strerror(errno.EIO)
here = threading.local()  # .rank: the simulated rank of this thread; .failing: a read in progress should fail


class ThreadComm:
    """N ranks as N threads: `at(r)` is rank r's communicator, whose allgather waits for every rank."""

    def __init__(self, n: int) -> None:
        self.size, self.values, self.barrier = n, [None] * n, threading.Barrier(n, timeout=20)

    def at(self, r: int) -> "RankComm":
        return RankComm(self, r)


class RankComm:
    def __init__(self, group: ThreadComm, rank: int) -> None:
        self.group, self.rank, self.size = group, rank, group.size

    def allgather(self, value):
        self.group.values[self.rank] = value
        self.group.barrier.wait()
        out = list(self.group.values)
        self.group.barrier.wait()
        return out


class BrokenFile:
    """A file whose reads fail as a failing disk's do."""

    def __init__(self, f) -> None:
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()

    def seek(self, *args):
        return self.f.seek(*args)

    def read(self, *args):
        raise OSError(errno.EIO, EIO)

    readline = read


def _fails_on(monkeypatch, rank: int | None, where: str) -> None:
    """Reads fail on `rank` (None: on any) while `where` runs: 'blocks' (a text file's line starts),
    'count' or '_lines' (a text block's bytes), or 'parquet' (a row group's read)."""
    fails = lambda: rank is None or getattr(here, "rank", 0) == rank  # noqa: E731
    if where == "parquet":
        real_read = stream.pq.ParquetFile.read_row_group

        def read_row_group(self, i, *args, **kwargs):
            if fails():
                raise OSError(errno.EIO, EIO)
            return real_read(self, i, *args, **kwargs)
        monkeypatch.setattr(stream.pq.ParquetFile, "read_row_group", read_row_group)
        return
    real = getattr(stream.BlockFile, where)

    def failing(self, *args):
        here.failing = fails()
        try:
            return real(self, *args)
        finally:
            here.failing = False
    monkeypatch.setattr(stream.BlockFile, where, failing)
    monkeypatch.setattr(stream, "open", lambda *a, **k: (BrokenFile if getattr(here, "failing", False)
                                                          else lambda f: f)(builtins.open(*a, **k)), raising=False)


def _on_thread_ranks(data, ranks: int) -> list[BaseException | None]:
    """`prepare_streamed` on `ranks` threads through the real `fit_ranks`: what each raised."""
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data.stream_prepare import prepare_streamed
    cfg = DataConfig(train=data, target="label", validation_split=0.15, test_split=0.1)
    group, raised = ThreadComm(ranks), [None] * ranks

    def run(r: int) -> None:
        here.rank = r
        try:
            prepare_streamed(cfg, "classification", 4, ranks=fit_ranks(group.at(r)))
        except BaseException as exc:  # noqa: BLE001  (what each rank raised, checked below)
            raised[r] = exc
    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    return raised


@pytest.mark.parametrize("kind, where, named", [("csv", "blocks", "its line starts"), ("csv", "count", "bytes "),
                                                ("csv", "_lines", "bytes "),
                                                ("jsonl", "_lines", "bytes "), ("parquet", "parquet", "row group ")])
@pytest.mark.usefixtures("small_blocks")
def test_a_read_failing_on_one_rank_is_one_data_error_on_every_rank(tmp_path, monkeypatch, kind, where, named):
    data = _write(tmp_path, kind)
    _fails_on(monkeypatch, 1, where)
    raised = _on_thread_ranks(data, 3)
    assert all(isinstance(exc, MagmaError) and exc.collective and exc.exit_code == 2 for exc in raised), raised
    message = str(raised[0])
    assert all(str(exc) == message for exc in raised)
    assert message.startswith("rank 1 on ") and str(data) in message and named in message, message
    assert EIO in message and "check the file is readable and the disk healthy" in message, message


@pytest.mark.parametrize("kind, where, named", [("csv", "_lines", "bytes "), ("parquet", "parquet", "row group 0")])
@pytest.mark.usefixtures("small_blocks")
def test_a_failing_read_is_one_message_through_the_cli(tmp_path, capsys, monkeypatch, kind, where, named):
    data = _write(tmp_path, kind)
    config = _config(tmp_path, data)
    _fails_on(monkeypatch, None, where)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run")
    assert code == 2, out + err
    assert str(data) in err and named in err and EIO in err and "rerun" in err, err
    assert "Traceback" not in out + err and not (tmp_path / "run" / "model.npz").exists()
