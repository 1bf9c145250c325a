"""The decoded-image cache when things go wrong (issue 46, found by a hostile trial): a decoding worker
dies with the process that started it (a SIGKILLed `train` left a worker holding the cache's lock, and
every later run on that folder hung without a word); a run waiting for the lock says whom it waits
for; a dead writer's temp file is removed by the next run of that slot; a cache folder that cannot be
used decodes in memory, said once, for predict too (it takes no config to set another)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from conftest import ROOT, run_cli
from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data import image_cache, image_folder
from magmadnn_cli.data.readers import ReadSpec, read_table

Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals and flock are Linux's")
rng = np.random.default_rng(4655)


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "magmadnn" / "images"


def folder(root, per=3):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per):
            Image.fromarray(rng.integers(0, 256, (4, 4), dtype=np.uint8)).save(root / c / f"{i}.png")


def spec():
    return ReadSpec(None, None, data=DataConfig(train="x"))


def gone(pid: int, within: float = 30.0) -> bool:
    """Whether process `pid` ends (is reaped by init) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)  # polling a condition with a deadline, not a fixed wait
    return False


def test_a_worker_dies_with_its_parent_killed_and_frees_the_lock(tmp_path):
    """A process decoding a folder (its worker stopped mid-span) is SIGKILLed: the worker ends too, and
    the next read of the folder decodes it (it hung on the orphan's lock before)."""
    folder(tmp_path / "t", per=200)
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from magmadnn_cli.config.schema import DataConfig
        from magmadnn_cli.data import image_folder, image_pool
        from magmadnn_cli.data.readers import ReadSpec, read_table
        main, real = os.getpid(), image_folder.decode_block
        def stuck(start, paths, *rest):
            if os.getpid() != main:
                print(os.getpid(), flush=True)
                time.sleep(600)  # a worker mid-span, stopped here until the test is done with it
            return real(start, paths, *rest)
        image_pool.PARALLEL_AFTER_S = {{"fork": 0.0, "spawn": 0.0}}
        image_folder.decode_block = stuck
        read_table(Path({str(tmp_path / "t")!r}), ReadSpec(None, None, data=DataConfig(train="x", image={{"workers": 2}})))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    worker = int(parent.stdout.readline())  # the worker is in its span, the cache's lock held
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    try:
        assert gone(worker), "the decoding worker outlived its killed parent"
    finally:
        with contextlib.suppress(ProcessLookupError):  # a worker left by the code before the fix
            os.kill(worker, signal.SIGKILL)
    table = read_table(tmp_path / "t", spec())  # the lock is free: no hang
    assert len(table.x) == 400


def test_a_dead_writers_temp_file_is_removed_by_the_next_run(tmp_path, cache_home):
    """Only a temp file this host's writer left when it died: a live process's stays (on a cluster
    whose shared folder's locks hold per node, another node's writer may be at work), and so does
    another host's, whose process cannot be looked up from here."""
    import socket
    folder(tmp_path / "t")
    read_table(tmp_path / "t", spec())
    (npy,) = cache_home.glob("*.npy")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    stale = npy.parent / f".{npy.name}.{dead.pid}@{host}.abc12345.tmp"
    live = npy.parent / f".{npy.name}.{os.getpid()}@{host}.def12345.tmp"
    remote = npy.parent / f".{npy.name}.{dead.pid}@another-node.ghi12345.tmp"
    for path in (stale, live, remote):
        path.write_bytes(b"half a cache")
    npy.unlink()  # the slot is decoded again
    read_table(tmp_path / "t", spec())
    assert not stale.exists() and live.exists() and remote.exists()
    assert len(list(cache_home.glob(f".{npy.name}.*.tmp"))) == 2  # this run's own temp renamed, not left


def test_a_lock_file_that_cannot_be_opened_decodes_in_memory(tmp_path, cache_home):
    """Another user's lock file in a shared cache folder (0644: not writable here) cannot be opened:
    a folder made a directory stands in for it (root opens any file)."""
    folder(tmp_path / "t")
    read_table(tmp_path / "t", spec())
    (npy,) = cache_home.glob("*.npy")
    lock = npy.with_suffix(".lock")
    lock.unlink()
    lock.mkdir()
    npy.unlink()
    table = read_table(tmp_path / "t", spec())
    assert len(table.x) == 6 and any("decoded in memory, not cached" in n and ".lock" in n for n in table.notes)


def test_a_run_waiting_for_the_lock_says_whom_it_waits_for(tmp_path, cache_home):
    folder(tmp_path / "t")
    read_table(tmp_path / "t", spec())
    (npy,) = cache_home.glob("*.npy")
    said, waiting = [], threading.Event()

    def say(text):
        said.append(text)
        waiting.set()
    with image_cache.locked(npy.with_suffix("")):  # another run holding the slot
        def read():
            with image_folder.decode_progress(say):
                read_table(tmp_path / "t", spec())
        reader = threading.Thread(target=read)
        reader.start()
        assert waiting.wait(30)
    reader.join(30)
    assert not reader.is_alive()
    assert f"waiting for process {os.getpid()}," in said[0] and "waiting" in said[0] and str(tmp_path / "t") in said[0]


def test_a_cache_folder_that_cannot_be_made_decodes_in_memory_said(tmp_path, monkeypatch, capsys):
    folder(tmp_path / "t")
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    table = read_table(tmp_path / "t", spec())
    assert len(table.x) == 6
    note = " ".join(table.notes)
    assert "decoded in memory, not cached" in note and "data.image.cache_dir" in note
    (tmp_path / "c.yaml").write_text(
        "name: m\nseed: 0\ndata: {train: t/}\nmodel:\n  layers:\n    - {type: flatten}\n"
        "    - {type: dense, units: 2, activation: softmax}\nloss: cross_entropy\noptimizer: {type: adam}\n"
        "training: {epochs: 1, batch_size: 4}\n")
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 0, err
    code, out, err = run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "t"))
    assert code == 0 and out.count("\n") == 7, err


def test_a_paths_table_read_in_chunks_does_not_thrash_one_cache_slot(tmp_path, cache_home):
    """Each chunk of a streamed predict or evaluate is another listing of the same table: cached, each
    one decoded over the last one's slot (saying the cached copy was not used); chunks are decoded
    in memory, the whole table is cached."""
    from magmadnn_cli.data.image_column import imaged_chunks
    from magmadnn_cli.data.readers import reader_for
    folder(tmp_path / "im", per=4)
    rows = [f"im/{c}/{i}.png,{c}" for c in "ab" for i in range(4)]
    (tmp_path / "t.csv").write_text("photo,label\n" + "\n".join(rows) + "\n")
    data = DataConfig(train="x", target="label", columns={"photo": "image"})
    whole = read_table(tmp_path / "t.csv", ReadSpec.of(data))
    assert len(list(cache_home.glob("*.npy"))) == 1
    cached = {p: p.stat().st_mtime_ns for p in cache_home.glob("*.npy")}
    chunks = list(imaged_chunks(reader_for(tmp_path / "t.csv").chunks)(tmp_path / "t.csv", ReadSpec.of(data), 3))
    assert np.array_equal(np.concatenate([c.x for c in chunks]), whole.x)
    assert {p: p.stat().st_mtime_ns for p in cache_home.glob("*.npy")} == cached  # not written over
    assert not any("cache" in n for c in chunks for n in c.notes)
    from magmadnn_cli.inference.image_rows import input_chunks
    rows = list(input_chunks(tmp_path / "t.csv", ReadSpec.of(data), 3))
    assert np.array_equal(np.concatenate([r.table.x for r in rows]), whole.x)
    assert {p: p.stat().st_mtime_ns for p in cache_home.glob("*.npy")} == cached  # predict's chunks too


def test_a_file_rewritten_with_its_size_and_time_kept_is_decoded_again(tmp_path):
    """`touch -r`, `rsync -t` or a restore keep a changed file's size and modification time; its status
    change time (ctime, which no call sets back) and inode still tell, so the cache is not trusted."""
    folder(tmp_path / "t")
    path = tmp_path / "t" / "a" / "0.png"

    def padded(pixels):  # a PNG of 4,096 bytes (Pillow ignores bytes after IEND): the size kept
        Image.fromarray(pixels).save(tmp_path / "x.png")
        data = (tmp_path / "x.png").read_bytes()
        return data + b"\0" * (4096 - len(data))
    old = np.asarray(Image.open(path)).copy()
    path.write_bytes(padded(old))
    first = read_table(tmp_path / "t", spec())
    st = os.stat(path)
    path.write_bytes(padded(255 - old))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again = read_table(tmp_path / "t", spec())
    assert not any("read from the cache" in n for n in again.notes)
    where = list(again.kept["path"]).index("a/0.png")
    np.testing.assert_array_equal(again.x[where, 0], 255 - old)
    np.testing.assert_array_equal(first.x[where, 0], old)
