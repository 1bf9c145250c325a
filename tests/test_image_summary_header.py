"""`summary` of a config on image files decodes none (issue 46, first-epoch round item 3): the size and
colours come from the first file's header (Pillow's lazy open), or from data.image where it says
them; the shapes it reports are the ones training builds."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TINY_CNN, run_cli

Image = pytest.importorskip("PIL.Image")
ImageFile = pytest.importorskip("PIL.ImageFile")
rng = np.random.default_rng(4613)

CONFIG = """
name: looks
seed: 0
data: {{train: {train}, validation_split: 0.25{more}}}
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def decodes(monkeypatch):
    """Every image decode (Pillow's ImageFile.load: what inflates or decodes the pixels)."""
    calls = []
    real = ImageFile.ImageFile.load

    def counted(self):
        calls.append(self.format)
        return real(self)
    monkeypatch.setattr(ImageFile.ImageFile, "load", counted)
    return calls


def image(mode: str, size=(6, 5)) -> "Image.Image":
    h, w = size
    rgba = rng.integers(0, 256, size=(h, w, 4), dtype=np.uint8)
    if mode == "P+alpha":
        im = Image.fromarray(rgba[..., :3]).convert("P")
        im.info["transparency"] = 0
        return im
    if mode == "I;16":
        return Image.fromarray(rgba[..., 0].astype(np.uint16) * 257)
    return Image.fromarray(rgba).convert(mode)


def folder(root, mode, fmt, size=(6, 5)):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            im = image(mode, size)
            im.save(root / c / f"{i}.{fmt}", **({"transparency": 0} if mode == "P+alpha" else {}))


def summary(capsys, tmp_path, train, more=""):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(train=train, more=more) + TINY_CNN)
    code, out, err = run_cli(capsys, "summary", str(cfg))
    assert code == 0, err
    return out


@pytest.mark.parametrize("mode, fmt, channels", [("L", "png", 1), ("RGB", "jpg", 3), ("RGBA", "png", 4),
                                                 ("P+alpha", "png", 4), ("I;16", "png", 1), ("RGB", "webp", 3)])
def test_summary_reads_the_header_and_decodes_nothing(tmp_path, capsys, decodes, mode, fmt, channels):
    folder(tmp_path / "train", mode, fmt)
    out = summary(capsys, tmp_path, tmp_path / "train")
    assert decodes == []
    assert f"each sample's input is ({channels}, 6, 5)" in out, out
    assert "(4, 6, 5)" in out and f"{4 * 6 * 5 * 2 + 2:,}" in out  # conv output, dense parameters
    assert not (tmp_path / "xdg").exists()  # nothing cached


def test_summary_with_the_size_and_colours_given_opens_nothing(tmp_path, capsys, decodes, monkeypatch):
    folder(tmp_path / "train", "RGB", "png")
    opened = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: (opened.append(a), real(*a, **k))[1])
    out = summary(capsys, tmp_path, tmp_path / "train", ", image: {size: [3, 4], color: grayscale, resize: crop}, "
                                                           "normalize: standard")
    assert decodes == [] and opened == []
    assert "each sample's input is (1, 3, 4)" in out, out


def test_summary_of_a_path_column_decodes_nothing(tmp_path, capsys, decodes):
    folder(tmp_path / "im", "RGB", "jpg", size=(7, 9))
    rows = [f"im/{c}/{i}.jpg,{c}" for c in "ab" for i in range(4)]
    (tmp_path / "t.csv").write_text("photo,label\n" + "\n".join(rows) + "\n")
    out = summary(capsys, tmp_path, tmp_path / "t.csv", ", target: label, columns: {photo: image}")
    assert decodes == []
    assert "each sample's input is (3, 7, 9)" in out, out


def test_a_damaged_file_after_the_first_is_no_matter_to_summary(tmp_path, capsys, decodes):
    folder(tmp_path / "train", "L", "png")
    (tmp_path / "train" / "b" / "zz.png").write_bytes(b"damaged")
    assert "each sample's input is (1, 6, 5)" in summary(capsys, tmp_path, tmp_path / "train")
    assert decodes == []
