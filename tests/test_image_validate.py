"""`magmadnn validate` on image data (issue 46 item 1 of the last round): every file is checked cheaply
(Pillow's header open, then the format's own check: a PNG's chunks and checksums, a JPEG decoded at
an eighth of its size), in the decoder's worker processes, not decoded whole; each bad file is named
(or counted and listed under data.image.on_error: skip), exit 2, no traceback; summary still looks at
one image only."""

from __future__ import annotations

import io

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.data import image_decode, image_folder

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(4601)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def folder(root, per=4, h=12, w=10, suffix="png"):
    """root/{a,b}/<i>.<suffix> of noisy gray pixels (a PNG that does not compress to nothing)."""
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per):
            Image.fromarray(rng.integers(0, 256, size=(h, w), dtype=np.uint8)).save(root / c / f"{i}.{suffix}")


def damage(root):
    """A truncated PNG, a zero-byte JPEG and a text file renamed .png: the names as validate shows them."""
    good = (root / "a" / "1.png").read_bytes()
    (root / "a" / "1.png").write_bytes(good[: len(good) // 2])
    (root / "b" / "empty.jpg").write_bytes(b"")
    (root / "b" / "notes.png").write_text("these are my notes, not an image\n")
    return ["a/1.png", "b/empty.jpg", "b/notes.png"]


CONFIG = """
name: checked
seed: 0
data: {{train: {train}, validation_split: 0.25{image}}}
model:
  layers:
    - {{type: conv2d, filters: 2, kernel_size: 3, padding: same, activation: relu}}
    - {{type: flatten}}
    - {{type: dense, units: 2, activation: softmax}}
loss: cross_entropy
optimizer: {{type: sgd, learning_rate: 0.1}}
training: {{epochs: 1, batch_size: 4}}
"""


def config(tmp_path, train, image=""):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(train=train, image=f", image: {{{image}}}" if image else ""))
    return cfg


@pytest.fixture
def decoded(monkeypatch):
    """The files decoded whole (decode_block's paths)."""
    seen = []
    real = image_folder.decode_block
    monkeypatch.setattr(image_folder, "decode_block", lambda start, paths, how, *into: (seen.extend(paths),
                                                                                 real(start, paths, how, *into))[1])
    return seen


@pytest.mark.parametrize("workers", [1, 2])
def test_validate_names_every_bad_file_without_decoding_the_folder(tmp_path, capsys, decoded, workers):
    folder(tmp_path / "train", per=40)
    bad = damage(tmp_path / "train")
    code, out, err = run_cli(capsys, "validate", config(tmp_path, tmp_path / "train", f"workers: {workers}"))
    assert code == 2, err
    assert "Traceback" not in err and not err.rstrip().endswith(": valid")
    for name in bad:
        assert name in err, err
    assert "3 of 82 image files cannot be read" in err and "on_error: skip" in err
    assert "a/1.png: truncated" in err and "b/empty.jpg: cannot identify image file (empty" in err
    assert len(decoded) <= 1  # checked, not decoded: at most the first image, for the defaults
    assert not (tmp_path / "xdg").exists()


def test_validate_under_skip_counts_and_lists_them(tmp_path, capsys):
    folder(tmp_path / "train", per=10)
    bad = damage(tmp_path / "train")
    code, _, err = run_cli(capsys, "validate", config(tmp_path, tmp_path / "train", "on_error: skip"))
    assert code == 0, err
    line = next(line for line in err.splitlines() if "skipped" in line)
    assert "3 file(s)" in line and all(name in line for name in bad)
    assert err.rstrip().endswith("valid")


def test_a_truncated_jpeg_found_by_the_check(tmp_path):
    path = tmp_path / "x.jpg"
    Image.fromarray(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(path, quality=90)
    image_decode.check(path)  # a whole file passes
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(OSError, match="truncated"):
        image_decode.check(path)


def test_every_kind_of_good_file_passes_the_check(tmp_path):
    pixels = rng.integers(0, 256, size=(9, 7, 3), dtype=np.uint8)
    for suffix in ("png", "jpg", "bmp", "gif", "webp", "tif"):
        Image.fromarray(pixels).save(tmp_path / f"x.{suffix}")
    _, failed = image_decode.check_block(0, sorted(str(p) for p in tmp_path.iterdir()))
    assert failed == []


def test_validate_names_a_bad_image_in_a_path_column_by_its_row(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    rows = ["photo,label"]
    for i in range(8):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, size=(6, 5), dtype=np.uint8)).save(buf, "PNG")
        (tmp_path / "images" / f"{i}.png").write_bytes(buf.getvalue()[: 40] if i == 5 else buf.getvalue())
        rows.append(f"images/{i}.png,{'hi' if i % 2 else 'lo'}")
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(train=tmp_path / "t.csv", image="").replace(
        "validation_split: 0.25", "validation_split: 0.25, target: label, columns: {photo: image}"))
    code, _, err = run_cli(capsys, "validate", cfg)
    assert code == 2 and "data row 6" in err and "images/5.png" in err, err


def test_summary_checks_nothing_and_decodes_nothing(tmp_path, capsys, decoded):
    folder(tmp_path / "train", per=10)
    damage(tmp_path / "train")
    code, out, err = run_cli(capsys, "summary", config(tmp_path, tmp_path / "train"))
    assert code == 0, err
    assert len(decoded) == 0  # the first image's header gives the shape (tests/test_image_summary_header.py)
