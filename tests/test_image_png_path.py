"""The PNG files most folders hold (8-bit grayscale, RGB or RGBA, not interlaced, no palette, no
transparency, only chunks that change no pixel) are inflated by Pillow's zip decoder without
Image.open's plugin search and parser (issue 46, PNG first epoch); every other PNG, and every damaged
one, goes through Image.open as before: the same pixels and the same messages either way."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from magmadnn_cli.data import image_decode, image_png
from magmadnn_cli.data.image_decode import Decoding

Image = pytest.importorskip("PIL.Image")
PngImagePlugin = pytest.importorskip("PIL.PngImagePlugin")
rng = np.random.default_rng(4646)


@pytest.fixture
def opened(monkeypatch):
    """Every Image.open call (the path a simple PNG no longer takes)."""
    calls = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1])
    return calls


def pillow_only(path, how, monkeypatch):
    """The file decoded with Image.open (the fast path turned off): the reference."""
    with monkeypatch.context() as m:
        m.setattr(image_png, "simple_png", lambda path: None)
        return image_decode.decode(path, how)


def failure(path, how):
    _, _, failed, _ = image_decode.decode_block(0, [str(path)], how)
    return failed


def chunk(cid: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + cid + body + struct.pack(">I", zlib.crc32(cid + body))


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """A PNG's chunks (type, body), in order."""
    out, pos = [], 8
    while pos < len(data):
        length, cid = struct.unpack_from(">I4s", data, pos)
        out.append((cid, data[pos + 8:pos + 8 + length]))
        pos += 12 + length
    return out


def png(parts: list[tuple[bytes, bytes]]) -> bytes:
    return image_png.SIGNATURE + b"".join(chunk(c, b) for c, b in parts)


def save(path, mode="RGB", size=(9, 11), **params):
    pixels = rng.integers(0, 256, (*size, 4), dtype=np.uint8)
    Image.fromarray(pixels, "RGBA").convert(mode).save(path, **params)
    return path


ADAM7 = [(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1)]


def interlaced(path, size=(8, 8)):
    """An RGB PNG written interlaced (Adam7's 7 passes: first row, first column, row step, column step;
    Pillow writes none), of values 0-4: read as one plain pass, every byte is a valid filter type."""
    p = rng.integers(0, 5, (*size, 3), dtype=np.uint8)
    raw = b"".join(b"\0" + p[r, c0::dc].tobytes() for r0, c0, dr, dc in ADAM7 for r in range(r0, size[0], dr)
                   if p[r, c0::dc].size)
    path.write_bytes(png([(b"IHDR", struct.pack(">IIBBBBB", size[1], size[0], 8, 2, 0, 0, 1)),
                          (b"IDAT", zlib.compress(raw)), (b"IEND", b"")]))
    with Image.open(path) as im:
        assert im.info.get("interlace") and np.array_equal(np.asarray(im), p)
    return path


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
def test_a_simple_png_is_decoded_without_image_open(tmp_path, opened, mode):
    path = save(tmp_path / "x.png", mode)
    how = Decoding((9, 11), {"L": "grayscale", "RGB": "rgb", "RGBA": "rgba"}[mode], "stretch")
    _, block, failed, _ = image_decode.decode_block(0, [str(path)], how)
    assert not failed and opened == []
    with Image.open(path) as im:
        np.testing.assert_array_equal(block[0], np.asarray(im).reshape(9, 11, -1).transpose(2, 0, 1))


def variants(tmp_path):
    """PNGs of every kind: the simple ones, the ones left to Pillow, and simple ones with extra chunks
    or their pixel data split in several IDAT chunks."""
    out = {m: save(tmp_path / f"{m.replace(';', '')}.png", m) for m in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16")}
    out["interlaced"] = interlaced(tmp_path / "interlaced.png")
    trns = Image.fromarray(rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)).convert("P")
    trns.save(tmp_path / "ptrns.png", transparency=3)
    out["P+tRNS"] = tmp_path / "ptrns.png"
    out["RGB+tRNS"] = save(tmp_path / "rgbtrns.png", "RGB", transparency=(1, 2, 3))
    out["big, several IDAT"] = save(tmp_path / "big.png", "RGB", size=(300, 280))
    base = chunks(save(tmp_path / "base.png", "RGBA").read_bytes())
    extra = [base[0], (b"gAMA", struct.pack(">I", 45455)), (b"pHYs", struct.pack(">IIB", 3780, 3780, 1)),
             (b"bKGD", b"\0\0\0\0\0\0"), *base[1:-1], (b"tIME", b"\x07\xea\x0b\x1c\x0c\x00\x00"), base[-1]]
    (tmp_path / "chunks.png").write_bytes(png(extra))
    out["ancillary chunks"] = tmp_path / "chunks.png"
    idat = base[1][1]
    (tmp_path / "split.png").write_bytes(png([base[0], (b"IDAT", idat[:7]), (b"IDAT", idat[7:]), base[-1]]))
    out["split IDAT"] = tmp_path / "split.png"
    text = [base[0], (b"tEXt", b"Software\0test"), *base[1:]]
    (tmp_path / "text.png").write_bytes(png(text))
    out["tEXt"] = tmp_path / "text.png"
    return out


@pytest.mark.parametrize("color", ["grayscale", "rgb", "rgba"])
@pytest.mark.parametrize("size, resize", [((9, 11), "stretch"), ((5, 8), "crop"), ((12, 7), "pad")])
def test_every_kind_of_png_gives_pillows_pixels(tmp_path, monkeypatch, color, size, resize):
    how = Decoding(size, color, resize)
    for kind, path in variants(tmp_path).items():
        expected = pillow_only(path, how, monkeypatch)
        np.testing.assert_array_equal(image_decode.decode(path, how), expected, err_msg=kind)
        _, block, failed, _ = image_decode.decode_block(0, [str(path)], how)
        assert not failed
        np.testing.assert_array_equal(block[0], expected, err_msg=kind)


def test_which_pngs_take_the_fast_path(tmp_path):
    taken = {kind: image_png.simple_png(str(path)) is not None for kind, path in variants(tmp_path).items()}
    assert taken == {"1": False, "L": True, "LA": False, "P": False, "RGB": True, "RGBA": True, "I;16": False,
                     "interlaced": False, "P+tRNS": False, "RGB+tRNS": False, "big, several IDAT": True,
                     "ancillary chunks": True, "split IDAT": True, "tEXt": False}


def damaged(tmp_path) -> dict[str, bytes]:
    good = save(tmp_path / "good.png", "RGB").read_bytes()
    parts = chunks(good)
    header, idat, end = parts[0], parts[1][1], parts[-1]
    bad_crc = bytearray(good)
    bad_crc[29] ^= 0xFF  # IHDR's CRC
    squeezed = zlib.compress(zlib.decompress(idat)[:-20])
    garbage = bytes(rng.integers(0, 256, len(idat), dtype=np.uint8))
    odd = header[1][:10] + b"\x01" + header[1][11:]  # compression method 1
    return {"truncated": good[:len(good) // 2], "empty": b"", "header CRC": bytes(bad_crc),
            "short pixel data": png([header, (b"IDAT", squeezed), end]),
            "garbage pixel data": png([header, (b"IDAT", garbage), end]),
            "no IEND": png([header, (b"IDAT", idat)]),
            "unknown compression": png([(b"IHDR", odd), (b"IDAT", idat), end]),
            "short gAMA": png([header, (b"gAMA", b"\0\1"), (b"IDAT", idat), end]),
            "bad chunk name": png([header, (b"a1!b", b"xy"), (b"IDAT", idat), end]),
            "IDAT interrupted": png([header, (b"IDAT", idat[:5]), (b"pHYs", bytes(9)), (b"IDAT", idat[5:]), end])}


def test_damaged_pngs_fail_as_pillow_says(tmp_path, monkeypatch):
    how = Decoding((9, 11), "rgb", "stretch")
    for kind, data in damaged(tmp_path).items():
        path = tmp_path / f"{kind}.png"
        path.write_bytes(data)
        with monkeypatch.context() as m:
            m.setattr(image_png, "simple_png", lambda path: None)
            expected = failure(path, how)
        assert failure(path, how) == expected, kind
        if not expected:  # Pillow reads it: so do we, alike
            np.testing.assert_array_equal(image_decode.decode(path, how), pillow_only(path, how, monkeypatch))


def test_a_png_over_the_bomb_limit_is_refused_as_before(tmp_path, monkeypatch):
    path = save(tmp_path / "x.png", "RGB", size=(20, 20))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    failed = failure(path, Decoding((4, 4), "rgb", "stretch"))
    assert len(failed) == 1 and "decompression-bomb limit" in failed[0][1]
