"""Files a real folder holds beside its images (issue 46, hostile trial): macOS's AppleDouble files
(`._x.png`) and `__MACOSX/` folders and other hidden files are ignored and counted like hidden
folders (they failed the run, or became a class); a named pipe called `x.png` is refused by name
instead of hanging every command; a broken symbolic link is said to be one; the decompression-bomb
message states Pillow's numbers once."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(4656)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def spec(**image):
    return ReadSpec(None, None, data=DataConfig(train="x", image=image or None))


def images(root, names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (4, 4), dtype=np.uint8)).save(root / name)


def test_mac_and_hidden_files_are_ignored_and_counted(tmp_path):
    images(tmp_path / "t", ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png", "dog/.hidden.png"])
    (tmp_path / "t" / "cat" / "._0.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # not an image
    images(tmp_path / "t", ["__MACOSX/cat/._1.png", "cat/__MACOSX/x.png"])
    table = read_table(tmp_path / "t", spec())
    assert len(table.x) == 4 and sorted(set(table.y)) == ["cat", "dog"]
    notes = " ".join(table.notes)
    assert "4 images in 2 class folders" in notes and "ignored" in notes and "._0.png" in notes


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("name", ["pipe.png", "pipe.bmp"])
def test_a_named_pipe_is_refused_by_name_not_waited_on(tmp_path, name):
    images(tmp_path / "t", ["a/0.png", "b/0.png"])
    os.mkfifo(tmp_path / "t" / "b" / name)
    code = ("import sys; from pathlib import Path; from magmadnn_cli.config.schema import DataConfig;"
            "from magmadnn_cli.data.readers import ReadSpec, read_table\n"
            "try:\n    read_table(Path(sys.argv[1]), ReadSpec(None, None, data=DataConfig(train='x')))\n"
            "except Exception as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})  # hung for ever before
    assert f"b/{name}: cannot read as an image: not a regular file (a named pipe)" in out.stdout, out.stderr


def test_a_broken_symbolic_link_is_said(tmp_path):
    images(tmp_path / "t", ["a/0.png", "b/0.png"])
    os.symlink(tmp_path / "gone.png", tmp_path / "t" / "b" / "1.png")
    with pytest.raises(DataError, match=r"b/1.png: cannot read as an image: a broken symbolic link \(to .*gone.png\)"):
        read_table(tmp_path / "t", spec())


def test_the_bomb_message_states_the_numbers_once(tmp_path, monkeypatch):
    images(tmp_path / "t", ["a/0.png", "b/0.png"])
    Image.fromarray(np.zeros((40, 40), np.uint8)).save(tmp_path / "t" / "b" / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 1,600 pixels: over twice the limit (Pillow's error)
    with pytest.raises(DataError) as refused:
        read_table(tmp_path / "t", spec(size=[4, 4], color="grayscale"))
    text = str(refused.value)
    assert "big.png" in text and "1600" in text.replace(",", "") and "200" in text
    assert "(100)" not in text and "limit (100" not in text  # not a third, different limit beside Pillow's
