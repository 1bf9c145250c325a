"""A folder of class folders of image files as data: labels from folder names (sorted), nested folders,
other files ignored and counted once; Pillow decoding of 8- and 16-bit, palettes, alpha, GIF, JPEG,
WebP, TIFF; data.image size / color / resize; parallel workers giving the same pixels; validation
and test folders; each bad layout or file one message naming it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data import image_decode
from magmadnn_cli.data.prepare import prepare
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
rng = np.random.default_rng(46)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The decoded-image cache of each test in its own folder (and of the ranks it starts)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def gray(h=8, w=6):
    return rng.integers(0, 256, size=(h, w), dtype=np.uint8)


def save(path, array, mode=None, **kw):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = array if isinstance(array, Image.Image) else Image.fromarray(array, mode)
    image.save(path, **kw)
    return path


def spec(**image):
    return ReadSpec(None, None, data=DataConfig(train="x", image=image or None))


def folder(root, classes=("cat", "dog"), per=3, h=8, w=6):
    """root/<class>/<i>.png of random gray pixels; returns {path: pixels}."""
    written = {}
    for c in classes:
        for i in range(per):
            pixels = gray(h, w)
            written[save(root / c / f"{i}.png", pixels)] = pixels
    return written


def test_class_folders_read_in_order_with_nested_folders_and_other_files_counted(tmp_path):
    written = folder(tmp_path / "train")
    nested = gray()
    save(tmp_path / "train" / "dog" / "more" / "x.png", nested)
    (tmp_path / "train" / "cat" / "README.txt").write_text("notes")
    (tmp_path / "train" / "dog" / ".DS_Store").write_bytes(b"\0")
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()
    t = read_table(tmp_path / "train", ReadSpec(None, None))
    assert t.x.shape == (7, 1, 8, 6) and t.x.dtype == np.float32
    assert t.y.tolist() == ["cat"] * 3 + ["dog"] * 4
    expected = [written[tmp_path / "train" / c / f"{i}.png"] for c in ("cat",) for i in range(3)]
    expected += [written[tmp_path / "train" / "dog" / f"{i}.png"] for i in range(3)] + [nested]
    np.testing.assert_array_equal(t.x[:, 0], np.stack(expected))
    ignored = [n for n in t.notes if "ignored" in n]
    assert len(ignored) == 1 and "3 other file(s)" in ignored[0] and "README.txt" in ignored[0]


def test_numeric_folder_names_are_numeric_labels(tmp_path):
    folder(tmp_path / "t", classes=("10", "2", "9"), per=1)
    assert read_table(tmp_path / "t", ReadSpec(None, None)).y.tolist() == [10, 2, 9]  # typed; classes sort as numbers


def test_prepare_splits_stratified_and_scales_8bit(tmp_path):
    folder(tmp_path / "train", per=10)
    p = prepare(DataConfig(train=tmp_path / "train", validation_split=0.2, test_split=0.2), "classification", 0)
    assert p.classes == ["cat", "dog"] and p.sample_shape == (1, 8, 6)
    assert len(p.train.y) == 12 and np.bincount(p.validation.y).tolist() == [2, 2]
    assert 0 <= p.train.x.min() and p.train.x.max() <= 1.0
    assert p.settled["scale"] == pytest.approx(1 / 255)
    assert p.settled["image"].size == [8, 6] and p.settled["image"].color == "grayscale"


MODES = {  # name: (image, its file name, expected auto colour)
    "rgb": (lambda: Image.fromarray(rng.integers(0, 256, (5, 4, 3), dtype=np.uint8), "RGB"), "a.png", "rgb"),
    "rgba": (lambda: Image.fromarray(rng.integers(0, 256, (5, 4, 4), dtype=np.uint8), "RGBA"), "a.png", "rgba"),
    "palette": (lambda: Image.fromarray(rng.integers(0, 256, (5, 4, 3), dtype=np.uint8), "RGB").convert("P"),
                "a.png", "rgb"),
    "gray-alpha": (lambda: Image.fromarray(rng.integers(0, 256, (5, 4, 2), dtype=np.uint8), "LA"), "a.png", "rgba"),
    "one-bit": (lambda: Image.fromarray(gray(5, 4)).convert("1"), "a.bmp", "grayscale"),
    "tiff": (lambda: Image.fromarray(rng.integers(0, 256, (5, 4, 3), dtype=np.uint8), "RGB"), "a.tif", "rgb"),
    "webp": (lambda: Image.fromarray(rng.integers(0, 256, (5, 4, 3), dtype=np.uint8), "RGB"), "a.webp", "rgb"),
}


@pytest.mark.parametrize("kind", list(MODES))
def test_modes_decoded_as_pillow_converts_them(tmp_path, kind):
    make, name, auto = MODES[kind]
    image = make()
    kw = {"lossless": True} if name.endswith(".webp") else {}
    for c in ("a", "b"):
        save(tmp_path / "t" / c / name, image, **kw)
    t = read_table(tmp_path / "t", ReadSpec(None, None))
    with Image.open(tmp_path / "t" / "a" / name) as stored:
        want = np.asarray(stored.convert({"grayscale": "L", "rgb": "RGB", "rgba": "RGBA"}[auto]))
    want = want[None] if want.ndim == 2 else want.transpose(2, 0, 1)
    np.testing.assert_array_equal(t.x[0], want)
    gray_too = read_table(tmp_path / "t", spec(color="grayscale"))
    with Image.open(tmp_path / "t" / "a" / name) as stored:
        np.testing.assert_array_equal(gray_too.x[0, 0], np.asarray(stored.convert("RGBA" if "A" in stored.mode else
                                                                                   stored.mode).convert("L")))


def test_16_bit_gray_rescaled_to_8_bits(tmp_path):
    values = rng.integers(0, 65536, size=(5, 4)).astype(np.uint16)
    for c in ("a", "b"):
        save(tmp_path / "t" / c / "x.png", Image.fromarray(values))
    t = read_table(tmp_path / "t", ReadSpec(None, None))
    np.testing.assert_array_equal(t.x[0, 0], np.round(values / 65535 * 255))


def test_transparent_palette_is_rgba(tmp_path):
    image = Image.fromarray(gray(5, 4)).convert("P")
    image.info["transparency"] = 0
    for c in ("a", "b"):
        save(tmp_path / "t" / c / "x.png", image, transparency=0)
    t = read_table(tmp_path / "t", ReadSpec(None, None))
    assert t.x.shape[1] == 4


def test_gif_first_frame_and_jpeg(tmp_path):
    frames = [Image.fromarray(gray(6, 6)) for _ in range(3)]
    for c in ("a", "b"):
        save(tmp_path / "g" / c / "x.gif", frames[0], save_all=True, append_images=frames[1:])
    t = read_table(tmp_path / "g", ReadSpec(None, None))
    with Image.open(tmp_path / "g" / "a" / "x.gif") as first:
        np.testing.assert_array_equal(t.x[0, 0], np.asarray(first.convert("L")))
    smooth = np.tile(np.linspace(0, 255, 16, dtype=np.uint8), (16, 1))
    for c in ("a", "b"):
        save(tmp_path / "j" / c / "x.jpg", np.stack([smooth] * 3, axis=2), "RGB", quality=95)
    t = read_table(tmp_path / "j", ReadSpec(None, None))
    assert t.x.shape == (2, 3, 16, 16) and np.abs(t.x[0, 0] - smooth).max() < 12


@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
def test_resize_to_the_first_image_or_the_given_size(tmp_path, resize):
    big = Image.fromarray(rng.integers(0, 256, (12, 20, 3), dtype=np.uint8), "RGB")
    save(tmp_path / "t" / "a" / "0.png", Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), "RGB"))
    save(tmp_path / "t" / "b" / "1.png", big)
    t = read_table(tmp_path / "t", spec(resize=resize))
    assert t.x.shape == (2, 3, 6, 6)
    want = {"stretch": lambda: big.resize((6, 6), Image.Resampling.BILINEAR),
            "crop": lambda: ImageOps.fit(big, (6, 6), Image.Resampling.BILINEAR),
            "pad": lambda: ImageOps.pad(big, (6, 6), Image.Resampling.BILINEAR)}[resize]()
    np.testing.assert_array_equal(t.x[1], np.asarray(want).transpose(2, 0, 1))
    assert read_table(tmp_path / "t", spec(size=[4, 5], resize=resize)).x.shape == (2, 3, 4, 5)


def test_parallel_workers_give_the_same_pixels(tmp_path):
    written = folder(tmp_path / "t", per=150, h=4, w=4)  # 300 files: past the in-process limit
    one = read_table(tmp_path / "t", spec(workers=1))
    two = read_table(tmp_path / "t", spec(workers=2))
    np.testing.assert_array_equal(one.x, two.x)
    assert one.y.tolist() == two.y.tolist()
    np.testing.assert_array_equal(two.x[0, 0], written[tmp_path / "t" / "cat" / "0.png"])


def test_corrupt_file_named_in_workers_too(tmp_path):
    folder(tmp_path / "t", per=150, h=4, w=4)
    good = (tmp_path / "t" / "dog" / "7.png").read_bytes()
    (tmp_path / "t" / "dog" / "7.png").write_bytes(good[: len(good) // 2])
    for workers in (1, 2):
        with pytest.raises(DataError, match=r"dog/7\.png: cannot read as an image.*fix or remove the file"):
            read_table(tmp_path / "t", spec(workers=workers))


def test_validation_and_test_folders_decode_as_training_did(tmp_path):
    folder(tmp_path / "train", per=6)
    folder(tmp_path / "val", per=2, h=16, w=12)               # another size: resized to the training images'
    folder(tmp_path / "test", classes=("dog",), per=2)        # one class of the two
    p = prepare(DataConfig(train=tmp_path / "train", validation=tmp_path / "val", test=tmp_path / "test"),
                "classification", 0)
    assert p.validation.x.shape == (4, 1, 8, 6) and p.test.x.shape == (2, 1, 8, 6)
    assert p.test.y.tolist() == [1, 1] and p.validation.x.max() <= 1.0
    folder(tmp_path / "other", classes=("cat", "eel"), per=1)
    with pytest.raises(DataError, match="'eel'"):
        prepare(DataConfig(train=tmp_path / "train", test=tmp_path / "other"), "classification", 0)


def test_bad_layouts_each_one_message(tmp_path):
    folder(tmp_path / "empty", per=1)
    (tmp_path / "empty" / "eel").mkdir()
    (tmp_path / "empty" / "eel" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"empty/eel: a class folder with no image files"):
        read_table(tmp_path / "empty", ReadSpec(None, None))
    save(tmp_path / "loose" / "a.png", gray())
    with pytest.raises(DataError, match="not in class folders.*train/<class>/"):
        read_table(tmp_path / "loose", ReadSpec(None, None))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match="is a directory with no class folders of images"):
        read_table(tmp_path / "nothing", ReadSpec(None, None))
    with pytest.raises(DataError, match="one image is not a data set"):
        read_table(tmp_path / "loose" / "a.png", ReadSpec(None, None))
    folder(tmp_path / "one", classes=("cat",), per=2)
    with pytest.raises(DataError, match="single class"):
        prepare(DataConfig(train=tmp_path / "one"), "classification", 0)


def test_label_folder_not_utf8_named(tmp_path):
    folder(tmp_path / "t", per=1)
    bad = os.path.join(os.fsencode(tmp_path / "t"), b"caf\xe9")
    os.mkdir(bad)
    save(tmp_path / "t" / "cat" / "0.png", gray())
    with open(os.path.join(bad, b"0.png"), "wb") as f:
        Image.fromarray(gray()).save(f, format="PNG")
    with pytest.raises(DataError, match=r"b'caf\\xe9' is not named in valid UTF-8"):
        read_table(tmp_path / "t", ReadSpec(None, None))


def test_decompression_bomb_named(tmp_path, monkeypatch):
    folder(tmp_path / "t", per=1, h=40, w=40)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(DataError, match="cat/0.png: cannot read as an image: over Pillow's "
                                        "decompression-bomb limit"):
        read_table(tmp_path / "t", spec(size=[8, 8], color="grayscale"))


def test_without_pillow_the_extra_is_named(tmp_path, monkeypatch):
    folder(tmp_path / "t", per=1)
    monkeypatch.setattr(image_decode, "Image", None)
    with pytest.raises(DataError, match=r"needs Pillow: pip install 'magmadnn-cli\[images\]'"):
        read_table(tmp_path / "t", ReadSpec(None, None))


def test_train_a_cnn_from_a_folder(tmp_path, capsys):
    for c, level in (("dark", 40), ("light", 200)):
        for i in range(20):
            save(tmp_path / "train" / c / f"{i}.png", np.clip(rng.normal(level, 30, (8, 8)), 0, 255).astype(np.uint8))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: f\nseed: 0\ndata: {train: train/, test_split: 0.25}\nmodel:\n  layers:\n"
                   "    - {type: conv2d, filters: 4, kernel_size: 3, activation: relu}\n    - {type: flatten}\n"
                   "    - {type: dense, units: 2, activation: softmax}\nloss: cross_entropy\n"
                   "optimizer: {type: adam, learning_rate: 0.01}\ntraining: {epochs: 5, batch_size: 8}\n")
    code, out, err = run_cli(capsys, "train", cfg, "--out", tmp_path / "run")
    assert code == 0, out + err
    assert "40 images in 2 class folders" in out + err
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "size:" in saved and "color: grayscale" in saved
    import json
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] == 1.0, metrics


def test_shipped_digit_pngs_are_the_digits_csv():
    from conftest import ROOT
    rows = np.loadtxt(ROOT / "datasets" / "digits.csv.gz", delimiter=",", skiprows=1, dtype=np.int64)
    order = np.argsort(rows[:, 64], kind="stable")  # class folders in order, files by row number within
    t = read_table(ROOT / "datasets" / "digits_png", ReadSpec(None, None))
    assert t.x.shape == (1797, 1, 8, 8) and t.y.tolist() == rows[order, 64].tolist()
    np.testing.assert_array_equal(t.x.reshape(1797, 64), np.round(rows[order, :64] * 255 / 16))


@pytest.mark.slow
def test_digits_folder_config_trains_and_evaluates(capsys, tmp_path):
    from conftest import ROOT
    import json
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_folder.yaml", "--out", tmp_path / "r", "-q")
    assert code == 0, err
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["test"]["accuracy"] >= 0.97
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "r" / "model.npz", ROOT / "datasets" / "digits_png")
    assert code == 0 and "accuracy" in out, err


@pytest.mark.slow
def test_digits_folder_model_exports_taking_decoded_pixels(capsys, tmp_path):
    """The exported graph takes the images as decoded (0-255 float32, N x C x H x W) and scales them
    itself: its labels are predict's."""
    from conftest import ROOT
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_folder.yaml", "--out", tmp_path / "r", "-q",
                           "--set", "training.epochs=2")
    assert code == 0, err
    assert run_cli(capsys, "export", tmp_path / "r", "-o", tmp_path / "m.onnx")[0] == 0
    code, out, err = run_cli(capsys, "predict", tmp_path / "r" / "model.npz", ROOT / "datasets" / "digits_png")
    assert code == 0, err
    pixels = read_table(ROOT / "datasets" / "digits_png", ReadSpec(None, None)).x  # as decoded: 0-255
    assert pixels.max() == 255
    _, labels = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"features": pixels})
    assert [str(v) for v in labels.reshape(-1)] == [line.rsplit(",", 1)[1] for line in out.splitlines()[1:]]


@pytest.mark.parametrize("workers", [1, 2])
def test_on_error_skip_counts_and_lists_the_bad_files(tmp_path, workers):
    written = folder(tmp_path / "t", per=150, h=4, w=4)
    for name in ("cat/0.png", "dog/7.png"):  # the very first file too: the defaults come from the next one
        good = (tmp_path / "t" / name).read_bytes()
        (tmp_path / "t" / name).write_bytes(good[: len(good) // 2])
    t = read_table(tmp_path / "t", spec(workers=workers, on_error="skip"))
    assert t.x.shape == (298, 1, 4, 4) and t.y.tolist() == ["cat"] * 149 + ["dog"] * 149
    bad = {("cat", "0.png"), ("dog", "7.png")}
    kept = [p for c in ("cat", "dog") for p in sorted((tmp_path / "t" / c).iterdir()) if (c, p.name) not in bad]
    np.testing.assert_array_equal(t.x[:, 0], np.stack([written[p] for p in kept]))
    said = [n for n in t.notes if "skipped" in n]
    assert len(said) == 1 and "2 file(s)" in said[0] and "cat/0.png" in said[0] and "dog/7.png" in said[0]
    assert "on_error: skip" in said[0]


def test_on_error_skip_with_nothing_readable_refused(tmp_path):
    for c in ("a", "b"):
        (tmp_path / "t" / c).mkdir(parents=True)
        (tmp_path / "t" / c / "x.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="no image .* could be read"):
        read_table(tmp_path / "t", spec(on_error="skip"))


def test_predict_names_each_image_by_its_path_from_class_folders_a_flat_folder_or_one_file(capsys, tmp_path):
    """predict MODEL folder/ | image.png: one row per image, its path first (relative to the folder given),
    labelled as the training folders name the classes; evaluate scores a class-folder layout."""
    import csv
    import io
    import shutil

    from conftest import ROOT, run_cli
    shipped = ROOT / "datasets" / "digits_png"
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_folder.yaml", "--set", "training.epochs=6",
                           "--out", tmp_path / "run", "-q")
    assert code == 0, err
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", shipped)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 1797 and list(rows[0]) == ["path", "prediction"]
    right = sum(r["path"].split("/")[0] == r["prediction"] for r in rows)
    assert right / len(rows) > 0.9, right
    flat = tmp_path / "new"
    flat.mkdir()
    for r in rows[:: 300]:
        shutil.copy(shipped / r["path"], flat / r["path"].replace("/", "_"))
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", flat, "--proba")
    assert code == 0, err
    got = list(csv.DictReader(io.StringIO(out)))
    assert [g["prediction"] for g in got] == [r["prediction"] for r in rows[:: 300]]
    assert "prob_0" in got[0] and got[0]["path"] == sorted(p.name for p in flat.iterdir())[0]
    one = shipped / rows[5]["path"]
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", one)
    assert code == 0 and out.splitlines()[1] == f"{one},{rows[5]['prediction']}", out + err
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run", shipped, "--json")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_folder.yaml", "--set", f"data.train={one}")
    assert code == 2 and "one image is not a data set" in err


@pytest.mark.mpi
def test_two_ranks_train_a_folder_to_one_process_weights(tmp_path):
    """Every rank decodes the folder alike; 2 ranks give 1 process's model (float64, to rounding)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, find_mpiexec
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec in this environment")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    args = ["-m", "magmadnn_cli", "train", str(ROOT / "configs" / "digits_folder.yaml"), "--set", "precision=float64",
            "--set", "training.epochs=2", "--set", "distributed.strategy=allreduce", "-q"]
    for ranks, out in ((0, "one"), (2, "two")):
        prefix = [str(mpiexec), "-n", str(ranks)] if ranks else []
        done = subprocess.run([*prefix, sys.executable, *args, "--out", str(tmp_path / out)], capture_output=True,
                              text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)
        assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "one" / "model.npz") as one, np.load(tmp_path / "two" / "model.npz") as two:
        for k in (k for k in one.files if k.startswith("weights/")):
            np.testing.assert_allclose(two[k], one[k], rtol=1e-10, atol=1e-12, err_msg=k)
