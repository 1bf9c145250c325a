"""The decoded-image cache (issue 46 item 3): a second read maps the cached uint8 pixels instead of
decoding; a changed, added or removed file, other settings or a damaged cache decode again; a file
that changes while it is decoded is refused, nothing cached; a vanished file under on_error: skip is
skipped; two processes decode a folder once; progress lines through the reporter's hook; summary and
validate decode one image, not the folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data import image_folder, image_pool
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(460)


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    """Every test's default cache in its own folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "magmadnn" / "images"


def folder(root, classes=("a", "b"), per=4, h=6, w=5):
    written = {}
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per):
            pixels = rng.integers(0, 256, size=(h, w), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")
            written[root / c / f"{i}.png"] = pixels
    return written


def spec(**image):
    return ReadSpec(None, None, data=DataConfig(train="x", image=image or None))


@pytest.fixture
def decodes(monkeypatch):
    """The number of folder decodes (decode_all calls)."""
    calls = []
    real = image_folder.decode_all

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    monkeypatch.setattr(image_folder, "decode_all", counted)
    return calls


def pixels_of(written, root, table):
    order = [root / p for p in table.kept["path"]]
    return np.stack([written[p] for p in order])[:, None].astype(np.float32)


def test_second_read_comes_from_the_cache(tmp_path, decodes, cache_home):
    written = folder(tmp_path / "train")
    first = read_table(tmp_path / "train", spec())
    second = read_table(tmp_path / "train", spec())
    assert len(decodes) == 1
    np.testing.assert_array_equal(second.x, pixels_of(written, tmp_path / "train", second))
    np.testing.assert_array_equal(first.x, second.x)
    assert any("cached in" in n for n in first.notes) and any("read from the cache" in n for n in second.notes)
    names = sorted(p.suffix for p in cache_home.iterdir())
    assert names == [".json", ".lock", ".npy"]  # no temp file left behind


def test_a_changed_added_or_removed_file_decodes_again(tmp_path, decodes):
    root = tmp_path / "train"
    written = folder(root)
    read_table(root, spec())
    new = rng.integers(0, 256, size=(6, 5), dtype=np.uint8)
    Image.fromarray(new).save(root / "a" / "0.png")
    os.utime(root / "a" / "0.png", ns=(1, 1))  # another time, whatever the clock's resolution
    written[root / "a" / "0.png"] = new
    changed = read_table(root, spec())
    assert len(decodes) == 2 and any("changed since" in n for n in changed.notes)
    np.testing.assert_array_equal(changed.x, pixels_of(written, root, changed))
    (root / "b" / "3.png").unlink()
    assert len(read_table(root, spec()).x) == 7 and len(decodes) == 3
    Image.fromarray(new).save(root / "b" / "9.png")
    assert len(read_table(root, spec()).x) == 8 and len(decodes) == 4
    read_table(root, spec())
    assert len(decodes) == 4


def test_other_settings_have_their_own_slot(tmp_path, decodes):
    folder(tmp_path / "train")
    small = read_table(tmp_path / "train", spec(size=[3, 3]))
    read_table(tmp_path / "train", spec())
    again = read_table(tmp_path / "train", spec(size=[3, 3]))
    assert small.x.shape[1:] == (1, 3, 3) and len(decodes) == 2
    np.testing.assert_array_equal(small.x, again.x)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_cache_is_decoded_again_not_trusted(tmp_path, decodes, cache_home, damage):
    written = folder(tmp_path / "train")
    read_table(tmp_path / "train", spec())
    npy = next(cache_home.glob("*.npy"))
    data = bytearray(npy.read_bytes())
    if damage == "flip":
        data[-3] ^= 0xFF
        npy.write_bytes(bytes(data))
    elif damage == "truncate":
        npy.write_bytes(bytes(data[:-10]))
    else:
        npy.unlink()
    table = read_table(tmp_path / "train", spec())
    assert len(decodes) == 2 and any("not used" in n for n in table.notes)
    np.testing.assert_array_equal(table.x, pixels_of(written, tmp_path / "train", table))


def test_cache_off_and_cache_dir(tmp_path, decodes, cache_home):
    folder(tmp_path / "train")
    read_table(tmp_path / "train", spec(cache=False))
    read_table(tmp_path / "train", spec(cache=False))
    assert len(decodes) == 2 and not cache_home.exists()
    read_table(tmp_path / "train", spec(cache_dir=str(tmp_path / "mine")))
    assert len(list((tmp_path / "mine").glob("*.npy"))) == 1


def test_a_file_changed_while_decoding_is_refused_and_nothing_cached(tmp_path, monkeypatch, cache_home):
    folder(tmp_path / "train")
    real = image_folder.decode_all

    def meanwhile(*args, **kw):
        with open(tmp_path / "train" / "b" / "2.png", "ab") as f:
            f.write(b"more")  # a writer still at work
        return real(*args, **kw)
    monkeypatch.setattr(image_folder, "decode_all", meanwhile)
    with pytest.raises(DataError, match=r"b/2.png: changed while the images were decoded \(1 file"):
        read_table(tmp_path / "train", spec())
    assert not list(cache_home.glob("*.npy")) and not list(cache_home.glob("*.json"))


def test_a_file_vanishing_while_decoding_skipped_or_named(tmp_path, monkeypatch):
    folder(tmp_path / "train")
    real = image_folder.decode_all

    def meanwhile(*args, **kw):
        (tmp_path / "train" / "a" / "1.png").unlink(missing_ok=True)
        return real(*args, **kw)
    monkeypatch.setattr(image_folder, "decode_all", meanwhile)
    table = read_table(tmp_path / "train", spec(on_error="skip"))
    assert len(table.x) == 7 and "a/1.png" not in table.kept["path"]
    assert any("skipped" in n and "a/1.png" in n for n in table.notes)
    folder(tmp_path / "other")
    monkeypatch.setattr(image_folder, "decode_all", lambda *a, **k: (
        (tmp_path / "other" / "b" / "0.png").unlink(), real(*a, **k))[1])
    with pytest.raises(DataError, match=r"other/b/0.png: cannot read as an image: .*No such file"):
        read_table(tmp_path / "other", spec())


def test_failures_cached_by_a_skipping_run_are_refused_without_skip(tmp_path, decodes):
    folder(tmp_path / "train")
    (tmp_path / "train" / "a" / "bad.png").write_bytes(b"not a png")
    assert len(read_table(tmp_path / "train", spec(on_error="skip")).x) == 8
    with pytest.raises(DataError, match="a/bad.png: cannot read as an image"):
        read_table(tmp_path / "train", spec())
    assert len(decodes) == 1


def test_progress_lines_through_the_hook(tmp_path, monkeypatch):
    folder(tmp_path / "train", per=100, h=4, w=4)
    monkeypatch.setattr(image_folder, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(image_pool, "BLOCK", 16)
    lines = []
    with image_folder.decode_progress(lines.append):
        read_table(tmp_path / "train", spec(cache=False))
    read_table(tmp_path / "train", spec(cache=False))  # outside the hook: said nowhere
    assert lines and all(f"decoding {tmp_path / 'train'}: " in line and " of 200 images" in line for line in lines)
    assert lines[0].split(": ")[1].startswith("16 of 200")


READ = textwrap.dedent("""
    import sys
    from pathlib import Path
    from magmadnn_cli.config.schema import DataConfig
    from magmadnn_cli.data.readers import ReadSpec, read_table
    t = read_table(Path(sys.argv[1]), ReadSpec(None, None, data=DataConfig(train="x")))
    print(t.x.sum(), [n for n in t.notes if "cache" in n][0])
""")


def test_two_processes_decode_a_folder_once(tmp_path):
    folder(tmp_path / "train", per=50)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    procs = [subprocess.Popen([sys.executable, "-c", READ, str(tmp_path / "train")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = sorted(out.split(" ", 1)[1] for out, _ in outs)
    assert outs[0][0].split()[0] == outs[1][0].split()[0]  # the same pixels
    assert "read from the cache" in said[0] + said[1] and "cached in" in said[0] + said[1]


CONFIG = """
name: folder
seed: 0
data: {{train: {train}, validation_split: 0.25}}
model:
  layers:
    - {{type: conv2d, filters: 2, kernel_size: 3, padding: same, activation: relu}}
    - {{type: flatten}}
    - {{type: dense, units: 2, activation: softmax}}
loss: cross_entropy
optimizer: {{type: sgd, learning_rate: 0.1}}
training: {{epochs: 1, batch_size: 4}}
"""


@pytest.mark.parametrize("command", ["summary", "validate"])
def test_summary_decodes_no_image_and_validate_one_not_the_folder(tmp_path, capsys, monkeypatch, command):
    folder(tmp_path / "train", per=20)
    if command == "summary":  # validate checks every file (tests/test_image_validate.py)
        (tmp_path / "train" / "b" / "zz.png").write_bytes(b"damaged")  # never decoded by a look
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(train=tmp_path / "train"))
    decoded = []
    real = image_folder.decode_block
    monkeypatch.setattr(image_folder, "decode_block", lambda start, paths, how, *into: (decoded.append(len(paths)),
                                                                                 real(start, paths, how, *into))[1])
    code, out, err = run_cli(capsys, command, cfg)
    assert code == 0, err
    assert sum(decoded) == (command == "validate")  # summary: none (the header), validate: the first
    if command == "validate":
        assert "40 images in 2 class folders" in err and "valid" in err
    else:
        assert "each sample's input is (1, 6, 5)" in out, out
    assert not (tmp_path / "xdg").exists()  # a look writes no cache


def test_slots_of_folders_that_are_gone_are_pruned(tmp_path, cache_home):
    import shutil
    folder(tmp_path / "old")
    read_table(tmp_path / "old", spec())
    (cache_home / "notes.txt").write_text("a person's file")
    shutil.rmtree(tmp_path / "old")
    folder(tmp_path / "new")
    read_table(tmp_path / "new", spec())
    assert len(list(cache_home.glob("*.npy"))) == 1 and (cache_home / "notes.txt").exists()
