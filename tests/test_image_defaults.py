"""data.image's defaults for a folder of mixed images (issue 46 item 1, "the first image's size and
mode, as Ludwig", found with a folder of photos whose first file was grayscale): the size and colours
are those most of a sample of the files' headers have (spread over the listing; the first image's
where none is more common; colours tied: the wider), and a sample that differs is said, with the fix.
A given size and colour read no header."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data import image_folder
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError, MagmaError

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(4654)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def save(path, mode, h, w):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB").convert(mode).save(path)
    return path


def spec(**image):
    return ReadSpec(None, None, data=DataConfig(train="x", image=image or None))


def mixed(root):
    """cat/000.png grayscale 7x5 first; then 11 RGB images, 9 of them 6x6, 2 of other sizes."""
    first = save(root / "cat" / "000.png", "L", 7, 5)
    sizes = [(6, 6)] * 9 + [(9, 4), (5, 8)]
    for i, (h, w) in enumerate(sizes):
        save(root / ("cat" if i % 2 else "dog") / f"{i + 1:03d}.png", "RGB", h, w)
    return first


def test_colours_and_size_most_of_the_images_have_said(tmp_path):
    first = mixed(tmp_path / "t")
    table = read_table(tmp_path / "t", spec())
    assert table.x.shape == (12, 3, 6, 6)
    assert table.settled["image"].color == "rgb" and table.settled["image"].size == [6, 6]
    with Image.open(first) as im:  # the gray image widened to RGB (its gray copied), not the others narrowed
        want = np.asarray(im.convert("RGB").resize((6, 6), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    np.testing.assert_array_equal(table.x[0], want)
    said = " ".join(table.notes)
    assert "differ in colours" in said and "11 rgb, 1 grayscale" in said and "data.image.color" in said
    assert "differ in size" in said and "4 sizes" in said and "6x6, the most common (9 of them)" in said
    assert "data.image.size" in said


def test_alike_images_say_nothing_and_ties_go_to_the_first_size_and_the_wider_colours(tmp_path):
    for i in range(4):
        save(tmp_path / "same" / "ab"[i % 2] / f"{i}.png", "RGB", 5, 7)
    notes = " ".join(read_table(tmp_path / "same", spec()).notes)
    assert "differ" not in notes
    save(tmp_path / "tie" / "a" / "0.png", "L", 4, 4)
    save(tmp_path / "tie" / "b" / "1.png", "RGB", 8, 8)
    tied = read_table(tmp_path / "tie", spec())
    assert tied.settled["image"].size == [4, 4] and tied.settled["image"].color == "rgb"
    assert "resized to 4x4, the first image's, none more common" in " ".join(tied.notes)


def test_the_sample_is_spread_over_a_large_folder_and_given_settings_read_no_header(tmp_path, monkeypatch):
    for i in range(200):
        save(tmp_path / "t" / "ab"[i // 100] / f"{i:03d}.png", "L" if i < 100 else "RGB", 3, 3)
    looked = []
    real = image_folder.first_look
    monkeypatch.setattr(image_folder, "first_look", lambda path: (looked.append(path), real(path))[1])
    table = read_table(tmp_path / "t", spec())
    assert len(looked) == image_folder.SAMPLED and any("/b/" in str(p) for p in looked)
    assert table.settled["image"].color == "rgb"  # 32 gray, 32 rgb in the sample: the wider
    looked.clear()
    read_table(tmp_path / "t", spec(size=[3, 3], color="grayscale"))
    assert looked == []


def test_a_bad_file_in_the_sample_is_left_to_the_decode(tmp_path):
    mixed(tmp_path / "t")
    (tmp_path / "t" / "dog" / "050.png").write_bytes(b"not a png")  # the last file: in the sample
    with pytest.raises(DataError, match=r"dog/050.png: cannot read as an image"):
        read_table(tmp_path / "t", spec())
    table = read_table(tmp_path / "t", spec(on_error="skip"))
    assert table.x.shape == (12, 3, 6, 6)


def test_train_says_it_and_predict_decodes_as_training_did(tmp_path, capsys):
    mixed(tmp_path / "t")
    (tmp_path / "c.yaml").write_text(
        "name: mixed\nseed: 0\ndata: {train: t/}\nmodel:\n  layers:\n    - {type: flatten}\n"
        "    - {type: dense, units: 2, activation: softmax}\nloss: cross_entropy\noptimizer: {type: adam}\n"
        "training: {epochs: 1, batch_size: 4}\n")
    code, out, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 0 and "differ in colours" in out + err and "differ in size" in out + err
    code, out, _ = run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "t" / "cat" / "000.png"))
    assert code == 0 and out.count("\n") == 2  # a header and the one image, decoded as training did


def test_images_too_large_for_memory_name_the_size_setting(tmp_path, monkeypatch):
    from magmadnn_cli.core import backend as B
    for i in range(4):
        save(tmp_path / "t" / "ab"[i % 2] / f"{i}.png", "RGB", 40, 30)
    monkeypatch.setattr(B, "host_memory_available", lambda: 20_000)  # 4 x 3,600 values x 5 B: 72,000
    with pytest.raises(MagmaError, match=r"4 decoded images of 3 x 40 x 30 .*data.image.size") as refused:
        read_table(tmp_path / "t", spec())
    assert "would need" in str(refused.value)
