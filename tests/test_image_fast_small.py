"""The PNG and JPEG fast paths read a file whole, so they take small files only (image_png.SMALL_BYTES):
a large one goes to Image.open, which reads its header first (the decompression-bomb check, a JPEG's
draft) instead of every byte into each decoder's memory, and decodes it to the same pixels."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.data import image_jpeg, image_png
from magmadnn_cli.data.image_decode import Decoding, decode

Image = pytest.importorskip("PIL.Image")


@pytest.mark.parametrize("suffix, fast", [(".png", image_png.simple_png), (".jpg", image_jpeg.simple_jpeg)])
def test_a_file_over_the_limit_is_left_to_image_open_with_the_same_pixels(tmp_path, monkeypatch, suffix, fast):
    path = tmp_path / f"a{suffix}"
    pixels = np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(path)
    how = Decoding((40, 30), "rgb", "stretch")
    assert fast(path) is not None
    small = decode(path, how)
    opened = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real(*a, **k))
    monkeypatch.setattr(image_png, "SMALL_BYTES", path.stat().st_size - 1)
    assert fast(path) is None
    assert np.array_equal(decode(path, how), small) and opened
