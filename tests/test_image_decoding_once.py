"""data.image is resolved once per read (issue 46, last round item 2): `decoding` (which opens the
headers of a sample of the images, each once, for the default size and colours) runs once for a
folder and once for a path column, and the settled image block (and 8-bit scale) is written in one
place."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data import image_folder
from magmadnn_cli.data.readers import ReadSpec, read_table

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(4602)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def counted(monkeypatch):
    """Calls of image_folder.decoding, image_folder.first_look and image_folder.settle_eight_bit."""
    calls = {"decoding": 0, "first_look": 0, "settle_eight_bit": 0}
    for name in calls:
        real = getattr(image_folder, name)

        def wrapped(*args, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*args, **kw)
        monkeypatch.setattr(image_folder, name, wrapped)
    return calls


def images(root, names):
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(5, 4), dtype=np.uint8)).save(root / name)


def test_a_folder_resolves_its_decoding_once(tmp_path, counted):
    images(tmp_path / "t", [f"{c}/{i}.png" for c in "ab" for i in range(3)])
    t = read_table(tmp_path / "t", ReadSpec(None, None, data=DataConfig(train="x")))
    assert counted == {"decoding": 1, "first_look": 6, "settle_eight_bit": 1}  # the 6 files: all in the sample
    assert t.settled["image"].size == [5, 4] and t.settled["image"].color == "grayscale"
    assert t.settled["scale"] == pytest.approx(1 / 255)


def test_a_path_column_resolves_its_decoding_once(tmp_path, counted):
    images(tmp_path / "im", [f"{i}.png" for i in range(4)])
    (tmp_path / "t.csv").write_text("photo,label\n" + "".join(f"im/{i}.png,{i % 2}\n" for i in range(4)))
    spec = ReadSpec.of(DataConfig(train="x", target="label", columns={"photo": "image"}))
    t = read_table(tmp_path / "t.csv", spec)
    assert counted == {"decoding": 1, "first_look": 4, "settle_eight_bit": 1}
    assert t.settled["image"].size == [5, 4] and t.x.shape == (4, 1, 5, 4)
