"""Once the fitting pass has cached a block's encoded rows, the training file's bytes of that block
leave the page cache (issue 48, the 10 GB run): read twice by the fitting passes, they would
otherwise outrank the cache's pages (written once) and push out the blocks every epoch reads. Checked
with mincore(2): which of the file's pages the kernel holds."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.config.loading import load_config
from magmadnn_cli.data import stream, stream_cache
from magmadnn_cli.data.stream_prepare import prepare_streamed
from magmadnn_cli.data.table import ReadSpec
from test_stream_train import _config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"),
                                reason="mincore and posix_fadvise: Linux")
ROWS = 40_000


def _resident(path) -> float:
    """The share of the file's pages in the page cache."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    size, page = os.path.getsize(path), mmap.PAGESIZE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        pages = (size + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) == 0, os.strerror(ctypes.get_errno())
        held = np.frombuffer(vec, np.uint8) & 1
        del address
    return float(held.mean())


def _table() -> pa.Table:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(ROWS).round(6), rng.standard_normal(ROWS).round(6)
    kind = np.array(["x", "y", "z"])[rng.integers(0, 3, ROWS)]
    return pa.table({"a": a, "b": b, "kind": kind, "label": np.where(a + b > 0, "yes", "no")})


def _written(tmp_path, kind: str):
    """The table as a CSV or Parquet file, on disk (fsynced: clean pages, which advice can drop) and
    read once (its pages in the page cache)."""
    path = tmp_path / f"t.{kind}"
    if kind == "csv":
        import pyarrow.csv as pacsv
        pacsv.write_csv(_table(), path)
    else:
        pq.write_table(_table(), path, row_group_size=4_000)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        f.read()
    if stream_cache.file_system(str(tmp_path)) in stream_cache.MEMORY_FILE_SYSTEMS:
        pytest.skip("the test folder is memory (tmpfs): its pages are the file")
    if _resident(path) < 0.9:
        pytest.skip("the page cache did not keep a file just read (memory pressure)")
    return path


def _fitted(tmp_path, path) -> None:
    """The fitting passes of a streamed run on `path` (what `train` does before its first epoch)."""
    config = load_config(Path(_config(tmp_path, path, validation_split=0.1, test_split=0.0)))
    data = prepare_streamed(config.data, config.loss.task, 0)
    data.train.x.source.close()


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_a_cached_blocks_bytes_leave_the_page_cache_and_without_the_cache_they_stay(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(stream, "BLOCK_BYTES", 64 << 10)  # a CSV of ~1.1 MB: about 18 blocks
    monkeypatch.setattr(stream_cache, "room_for", lambda nbytes, folder=None: True)
    path = _written(tmp_path, kind)
    _fitted(tmp_path, path)
    assert _resident(path) < 0.1  # every block cached, its bytes released (the header or footer: a page or two)

    monkeypatch.setattr(stream_cache, "room_for", lambda nbytes, folder=None: False)  # no cache: read each pass
    path = _written(tmp_path, kind)
    _fitted(tmp_path, path)
    assert _resident(path) > 0.9


def test_a_parquet_file_moved_during_the_run_is_not_an_error(tmp_path, monkeypatch):
    """Releasing is advice: a file renamed (or damaged) since the pass opened it loses nothing, raises nothing."""
    path = _written(tmp_path, "parquet")
    file = stream.BlockFile.of(path, ReadSpec.of(DataConfig(train=path, target="label")))
    blocks = file.blocks()
    path.rename(tmp_path / "moved.parquet")
    file.release(blocks[0])  # (the spans are read from the footer on the first release)
    (tmp_path / "moved.parquet").write_bytes(b"PAR1 not a footer")
    (tmp_path / "moved.parquet").rename(path)
    file.release(blocks[1])
