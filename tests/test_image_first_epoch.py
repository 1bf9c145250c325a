"""The first epoch of a folder (issue 46, first-epoch round): the decoding workers write the pixels
straight into the cache's memory-mapped .npy (a temp file, fsynced and renamed; removed when decoding
fails; a full disk found before a page is written), so no pixels travel back to the reading process;
each file is stat'ed after decoding by the worker that decoded it; a JPEG much larger than the size
asked for is decoded by libjpeg at 1/2..1/8 scale (Image.draft), by every path that decodes (train,
predict, evaluate, serve); the pixels never depend on the number of workers."""

from __future__ import annotations

import errno
import io
import os

import numpy as np
import pytest

from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data import image_cache, image_decode, image_folder
from magmadnn_cli.data.image_decode import Decoding
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError, MagmaError

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")
rng = np.random.default_rng(4610)


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "magmadnn" / "images"


def photo(size=(96, 128)) -> np.ndarray:
    """A smooth RGB picture (a JPEG's kind of content), (H, W, 3) uint8."""
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (h + w)], axis=-1)
    return np.clip(base + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)


def folder(root, per=40, size=(7, 6), fmt="png", mode="RGB"):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per):
            im = Image.fromarray(photo(size)).convert(mode)
            im.save(root / c / f"{i:03d}.{fmt}")


def spec(**image):
    return ReadSpec(None, None, data=DataConfig(train="x", image=image or None))


def one_by_one(root, how):
    """Every file of the folder decoded alone (decode: what predict of one file and serve use)."""
    files = image_folder.list_classes(root).files
    return np.stack([image_decode.decode(f, how) for f in files])


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_write_into_the_cache_file_and_no_pixels_come_back(tmp_path, monkeypatch, cache_home, workers):
    folder(tmp_path / "t", per=70)  # 140 files: 3 blocks
    returned = []  # what each block sends back to this process
    real = image_folder._gathered
    monkeypatch.setattr(image_folder, "_gathered", lambda out, results, *rest: real(
        out, ((returned.append(r[1][1]), r)[1] for r in results), *rest))  # (files done, (start, pixels, ...))
    table = read_table(tmp_path / "t", spec(workers=workers))
    assert len(returned) == 3 and all(pixels is None for pixels in returned)
    how = Decoding((7, 6), "rgb", "stretch")
    np.testing.assert_array_equal(table.x, one_by_one(tmp_path / "t", how).astype(np.float32))
    assert len(list(cache_home.glob("*.npy"))) == 1 and not list(cache_home.glob(".*"))


def test_cached_and_uncached_reads_give_the_same_pixels(tmp_path):
    folder(tmp_path / "t", per=70, fmt="jpg")
    cached = read_table(tmp_path / "t", spec(workers=2))
    plain = read_table(tmp_path / "t", spec(workers=2, cache=False))
    np.testing.assert_array_equal(cached.x, plain.x)


def test_a_failed_decode_leaves_no_temp_file_in_the_cache(tmp_path, cache_home):
    folder(tmp_path / "t", per=70)
    (tmp_path / "t" / "b" / "050.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match="b/050.png: cannot read as an image"):
        read_table(tmp_path / "t", spec(workers=2))
    assert not [p for p in cache_home.iterdir() if p.suffix != ".lock"]


def test_a_full_disk_is_found_before_decoding_and_said(tmp_path, monkeypatch, cache_home):
    folder(tmp_path / "t", per=3)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    decodes = []
    monkeypatch.setattr(image_folder, "decode_block", lambda *a: decodes.append(a))
    with pytest.raises(MagmaError, match=r"cannot write: No space left on device; free space"):
        read_table(tmp_path / "t", spec())
    assert not decodes and not [p for p in cache_home.iterdir() if p.suffix != ".lock"]


def test_a_file_is_stated_after_decoding_by_its_worker(tmp_path, monkeypatch):
    """The changed-while-decoding check compares the key's stamps with the ones each block takes after
    decoding its files (no second pass over the folder here)."""
    folder(tmp_path / "t", per=3)
    calls = []
    real = image_cache.stamps
    monkeypatch.setattr(image_cache, "stamps", lambda files: (calls.append(len(files)), real(files))[1])
    read_table(tmp_path / "t", spec())
    assert calls == [6]  # the key's, once


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("resize", ["stretch", "crop", "pad"])
def test_a_large_jpeg_is_decoded_at_a_reduced_scale_everywhere_alike(tmp_path, mode, resize):
    """Image.draft: libjpeg decodes at 1/2..1/8 scale while the image stays >= 2x the size asked for
    (Pillow's thumbnail does the same); the pixels are close to a full decode + resize, and the same
    through every path (a folder read in blocks, one file, bytes from a request)."""
    path = tmp_path / "t" / "a" / "big.jpg"
    path.parent.mkdir(parents=True)
    Image.fromarray(photo((300, 400))).convert(mode).save(path, quality=95)
    color = {"RGB": "rgb", "L": "grayscale"}[mode]
    how = Decoding((24, 32), color, resize)
    one = image_decode.decode(path, how)
    _, block, failed, _ = image_decode.decode_block(0, [str(path)], how)
    assert not failed
    np.testing.assert_array_equal(block[0], one)
    np.testing.assert_array_equal(image_decode.decode(io.BytesIO(path.read_bytes()), how), one)
    drafted = Image.open(path)
    drafted.draft(None, (64, 48))  # the README's recipe: 2 x the size, (W, H)
    assert drafted.size == (100, 75)  # 1/4 scale
    full = Image.open(path).convert(MODE[color])
    fits = {"stretch": lambda im: im.resize((32, 24), Image.Resampling.BILINEAR),
            "crop": lambda im: ImageOps.fit(im, (32, 24), Image.Resampling.BILINEAR),
            "pad": lambda im: ImageOps.pad(im, (32, 24), Image.Resampling.BILINEAR)}[resize]
    reference = planar(fits(drafted.convert(MODE[color])))
    np.testing.assert_array_equal(one, reference)
    assert np.abs(one.astype(int) - planar(fits(full))).mean() < 2.0  # a few levels at most from a full decode


MODE = {"rgb": "RGB", "grayscale": "L"}


def planar(im) -> np.ndarray:
    a = np.asarray(im)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def test_small_jpegs_and_other_formats_are_decoded_whole(tmp_path):
    """Below 4x the size (and any PNG) nothing is drafted: a full decode, as before."""
    path = tmp_path / "x.jpg"
    Image.fromarray(photo((60, 80))).save(path)
    how = Decoding((20, 30), "rgb", "stretch")  # 80 // 60 = 1 < 2: no reduction
    expected = planar(Image.open(path).convert("RGB").resize((30, 20), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(image_decode.decode(path, how), expected)
    png = tmp_path / "x.png"
    Image.fromarray(photo((300, 400))).save(png)
    expected = planar(Image.open(png).convert("RGB").resize((32, 24), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(image_decode.decode(png, Decoding((24, 32), "rgb", "stretch")), expected)


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "RGB", "RGBA", "I;16", "CMYK"])
@pytest.mark.parametrize("color", ["grayscale", "rgb", "rgba"])
def test_a_block_decodes_every_mode_as_one_file_does(tmp_path, mode, color):
    fmt = "jpg" if mode == "CMYK" else "tif" if mode == "I;16" else "png"
    path = tmp_path / f"x.{fmt}"
    im = Image.fromarray(photo((9, 11)))
    (im.convert("I").point(lambda v: v * 200).convert("I;16") if mode == "I;16" else im.convert(mode)).save(path)
    how = Decoding((9, 11), color, "stretch")
    _, block, failed, after = image_decode.decode_block(5, [str(path)], how)
    assert not failed and block.shape == (1, *how.shape) and block.flags.c_contiguous
    np.testing.assert_array_equal(block[0], image_decode.decode(path, how))
    st = os.stat(path)
    assert after.tolist() == [[st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]]


def test_relative_paths_are_relpaths(tmp_path):
    folder(tmp_path / "t", per=2)
    for root in (tmp_path / "t", tmp_path / "t" / ".." / "t"):
        files = image_folder.list_classes(root).files
        assert image_cache.relative(files, root) == [os.path.relpath(f, root) for f in files]
    outside = [str(tmp_path / "elsewhere" / "x.png")]
    assert image_cache.relative(outside, tmp_path / "t.csv") == [os.path.relpath(outside[0], tmp_path / "t.csv")]
