"""The JPEG files most folders hold (8-bit grayscale or RGB, baseline, extended or progressive, no
Adobe, EXIF, MPF or Photoshop segment, not drafted) are decoded by Pillow's jpeg decoder without
Image.open's plugin search and parser (issue 46, JPEG first epoch); every other JPEG, and every
damaged one, goes through Image.open as before: the same pixels and the same messages either way."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from magmadnn_cli.data import image_decode, image_jpeg
from magmadnn_cli.data.image_decode import Decoding

Image = pytest.importorskip("PIL.Image")
ImageFile = pytest.importorskip("PIL.ImageFile")
rng = np.random.default_rng(4647)
COLORS = ["grayscale", "rgb", "rgba"]
SIZES = [((17, 31), "stretch"), ((9, 14), "crop"), ((20, 12), "pad")]


@pytest.fixture
def decoded(monkeypatch):
    """Every Image.frombytes call with the jpeg decoder (the fast path's decode)."""
    calls = []
    real = Image.frombytes
    monkeypatch.setattr(Image, "frombytes",
                        lambda *a, **k: (calls.append(a[:2]) if a[3:4] == ("jpeg",) else None, real(*a, **k))[1])
    return calls


def pillow_only(path, how, monkeypatch):
    """The file decoded with Image.open (the fast path turned off): the reference."""
    with monkeypatch.context() as m:
        m.setattr(image_jpeg, "simple_jpeg", lambda path, size=None: None)
        return image_decode.decode(path, how)


def failure(path, how):
    _, _, failed, _ = image_decode.decode_block(0, [str(path)], how)
    return failed


def picture(size=(17, 31), mode="RGB"):
    """Smooth colours with noise (what a photo's blocks hold), in `mode`."""
    h, w = size
    ramp = np.linspace(0, 255, h * w).reshape(h, w, 1) * np.array([1.0, 0.5, 0.2])
    pixels = np.clip(ramp + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB").convert(mode)


def save(path, mode="RGB", size=(17, 31), **params):
    picture(size, mode).save(path, "JPEG", **params)
    return path


def segments(data: bytes) -> list[tuple[int, bytes]]:
    """A JPEG's segments before its scan (marker, body), the scan and the rest as one (0xDA, bytes)."""
    out, pos = [], 2
    while data[pos + 1] != 0xDA:
        length = struct.unpack_from(">H", data, pos + 2)[0]
        out.append((data[pos + 1], data[pos + 4:pos + 2 + length]))
        pos += 2 + length
    return [*out, (0xDA, data[pos:])]


def jpeg(parts: list[tuple[int, bytes]]) -> bytes:
    return b"\xff\xd8" + b"".join(body if marker == 0xDA else bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2)
                                  + body for marker, body in parts)


def inserted(data: bytes, marker: int, body: bytes) -> bytes:
    """`data` with one more segment right after its SOI."""
    return jpeg([(marker, body), *segments(data)])


def exif() -> bytes:
    info = Image.Exif()
    info[0x010F] = "camera"
    return info.tobytes()


def variants(tmp_path) -> dict[str, object]:
    """JPEGs the fast path decodes (grayscale, RGB, qualities, subsampling, progressive, optimized,
    restart intervals, ICC, comments, odd sizes)."""
    out = {"L": save(tmp_path / "l.jpg", "L"), "RGB q90": save(tmp_path / "q90.jpg", quality=90),
           "q50": save(tmp_path / "q50.jpg", quality=50), "q100": save(tmp_path / "q100.jpg", quality=100),
           "4:4:4": save(tmp_path / "444.jpg", subsampling=0), "4:2:2": save(tmp_path / "422.jpg", subsampling=1),
           "4:2:0": save(tmp_path / "420.jpg", subsampling=2),
           "progressive": save(tmp_path / "prog.jpg", progressive=True),
           "progressive L": save(tmp_path / "progl.jpg", "L", progressive=True),
           "optimize": save(tmp_path / "opt.jpg", optimize=True),
           "restarts": save(tmp_path / "dri.jpg", restart_marker_blocks=1),
           "restart rows": save(tmp_path / "drirows.jpg", size=(40, 33), restart_marker_rows=1),
           "ICC": save(tmp_path / "icc.jpg", icc_profile=b"\0" * 300),
           "comment": save(tmp_path / "com.jpg", comment=b"a comment"),
           "31x17": save(tmp_path / "odd.jpeg", size=(31, 17)), "1x1": save(tmp_path / "one.jpg", size=(1, 1)),
           "3x larger (not drafted)": save(tmp_path / "x3.jpg", size=(70, 100))}
    base = out["RGB q90"].read_bytes()
    (tmp_path / "nojfif.jpg").write_bytes(jpeg([s for s in segments(base) if s[0] != 0xE0]))
    out["no JFIF segment"] = tmp_path / "nojfif.jpg"
    (tmp_path / "app5.jfif").write_bytes(inserted(base, 0xE5, b"some vendor data"))
    out["APP5, .jfif"] = tmp_path / "app5.jfif"
    return out


def fallbacks(tmp_path) -> dict[str, object]:
    """JPEGs left to Image.open: still read, the same pixels."""
    base = save(tmp_path / "base.jpg").read_bytes()
    out = {"CMYK": save(tmp_path / "cmyk.jpg", "CMYK"),
           "4x larger (drafted)": save(tmp_path / "x4.jpg", size=(68, 124)),
           "EXIF": save(tmp_path / "exif.jpg", exif=exif())}
    frames = [picture(), picture()]
    frames[0].save(tmp_path / "mpo.jpg", "MPO", save_all=True, append_images=frames[1:])
    out["MPO (two frames)"] = tmp_path / "mpo.jpg"
    for name, marker, body in [("Adobe", 0xEE, b"Adobe\0\x64\0\0\0\0\x01"), ("Adobe, short", 0xEE, b"Ado"),
                               ("Photoshop", 0xED, b"Photoshop 3.0\0")]:
        (tmp_path / f"{name}.jpg").write_bytes(inserted(base, marker, body))
        out[name] = tmp_path / f"{name}.jpg"
    return out


@pytest.mark.parametrize("color", COLORS)
@pytest.mark.parametrize("size, resize", SIZES)
def test_every_kind_of_jpeg_gives_pillows_pixels(tmp_path, monkeypatch, color, size, resize):
    how = Decoding(size, color, resize)
    for kind, path in {**variants(tmp_path), **fallbacks(tmp_path)}.items():
        expected = pillow_only(path, how, monkeypatch)
        np.testing.assert_array_equal(image_decode.decode(path, how), expected, err_msg=kind)
        _, block, failed, _ = image_decode.decode_block(0, [str(path)], how)
        assert not failed, kind
        np.testing.assert_array_equal(block[0], expected, err_msg=kind)


def test_which_jpegs_take_the_fast_path(tmp_path, monkeypatch, decoded):
    """The common kinds are decoded without Image.open; the others are turned away by their header,
    before any decoding (so none of them is decoded twice)."""
    opened = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: (opened.append(a[0]), real(*a, **k))[1])
    how = Decoding((17, 31), "rgb", "stretch")
    for kind, path in variants(tmp_path).items():
        image_decode.decode(path, how)
        assert opened == [], kind
    for kind, path in fallbacks(tmp_path).items():
        assert image_jpeg.simple_jpeg(str(path), how.size) is None, kind
    assert len(decoded) == len(variants(tmp_path))


@pytest.mark.parametrize("size, resize", [((280, 300), "stretch"), ((150, 200), "crop"), ((100, 90), "pad")])
def test_a_large_jpeg_gives_pillows_pixels(tmp_path, monkeypatch, decoded, size, resize):
    """A file Image.open reads in several 64 KiB pieces (not drafted: under 4x the size asked for)."""
    path = save(tmp_path / "big.jpg", size=(280, 300), quality=100)
    assert path.stat().st_size > 65536
    for color in COLORS:
        how = Decoding(size, color, resize)
        np.testing.assert_array_equal(image_decode.decode(path, how), pillow_only(path, how, monkeypatch))
    assert len(decoded) == len(COLORS)


def test_the_draft_rule_is_the_decoders(tmp_path, decoded):
    """A JPEG 4x the size asked for in both dimensions is left to Image.open (which drafts it); 4x
    in one dimension only, or no size given, is not."""
    path = str(save(tmp_path / "x.jpg", size=(64, 64)))
    assert image_jpeg.simple_jpeg(path, (16, 16)) is None and not decoded
    assert image_jpeg.simple_jpeg(path, (16, 17)) is not None
    assert image_jpeg.simple_jpeg(path, (17, 16)) is not None
    assert image_jpeg.simple_jpeg(path) is not None


def header_refusals(tmp_path) -> dict[str, bytes]:
    """Files whose header the fast path turns away (Image.open fails on each, or reads it its own way)."""
    good = save(tmp_path / "good.jpg").read_bytes()
    parts = segments(good)
    sof = next(i for i, (m, _) in enumerate(parts) if m == 0xC0)

    def frame(**fields) -> bytes:
        precision, height, width, count = struct.unpack_from(">BHHB", parts[sof][1])
        values = {"precision": precision, "height": height, "width": width, "count": count, **fields}
        return jpeg([*parts[:sof], (fields.get("marker", 0xC0), struct.pack(
            ">BHHB", values["precision"], values["height"], values["width"], values["count"]) + parts[sof][1][6:]),
            *parts[sof + 1:]])
    dqt = next(i for i, (m, _) in enumerate(parts) if m == 0xDB)
    return {"not a JPEG": b"\x89PNG\r\n\x1a\n" + good[8:], "no SOI": b"\xff\x00" + good[2:],
            "12-bit": frame(precision=12), "lossless (SOF3)": frame(marker=0xC3),
            "arithmetic (SOF9)": frame(marker=0xC9), "no height (DNL)": frame(height=0), "no width": frame(width=0),
            "2 components": jpeg([*parts[:sof], (0xC0, struct.pack(">BHHB", 8, 17, 31, 2) + parts[sof][1][6:12]),
                                  *parts[sof + 1:]]),
            "CMYK without an Adobe segment": jpeg([p for p in segments(save(tmp_path / "cmyk.jpg", "CMYK").read_bytes())
                                                   if p[0] != 0xEE]),
            "DAC segment": inserted(good, 0xCC, b"\x00\x10"),
            "DHP segment after the frame": jpeg([*parts[:sof + 1], (0xDE, parts[sof][1][:1] + b"\x00\x08\x00\x08"
                                                                   + parts[sof][1][5:]), *parts[sof + 1:]]),
            "a marker without its 0xFF": good[:2] + b"\x00\xfe\x00\x04ab" + good[2:], "frame length wrong": jpeg([*parts[:sof], (0xC0, parts[sof][1] + b"\0"),
                                                                        *parts[sof + 1:]]),
            "two frames": jpeg([*parts[:sof + 1], parts[sof], *parts[sof + 1:]]),
            "12-bit frame, then an 8-bit one": jpeg([*parts[:sof], (0xC0, b"\x0c" + parts[sof][1][1:]), *parts[sof:]]),
            "no frame": jpeg([p for p in parts if p[0] != 0xC0]),
            "16-bit table cut short": jpeg([*parts[:dqt], (0xDB, b"\x10" + parts[dqt][1][1:65]), *parts[dqt + 1:]]),
            "ICC segment short": inserted(good, 0xE2, b"ICC_PROFILE\0\1"),
            "JFIF segment short": jpeg([(0xE0, b"JFIF\0\1"), *[p for p in parts if p[0] != 0xE0]]),
            "segment past the end": good[:len(jpeg(parts[:sof])) + 5],
            "scan header past the end": good[:len(jpeg(parts[:-1])) + 6],
            "segment length 1": good[:2] + b"\xff\xfe\x00\x01" + good[2:],
            "fill byte before a marker": good[:2] + b"\xff" + good[2:],
            "junk between segments": jpeg(parts[:sof]) + b"\x00" + jpeg(parts[sof:])[2:],
            "no scan": jpeg(parts[:-1])}


def test_odd_headers_are_left_to_image_open(tmp_path, monkeypatch, decoded):
    how = Decoding((17, 31), "rgb", "stretch")
    for kind, data in header_refusals(tmp_path).items():
        path = tmp_path / f"{kind}.jpg"
        path.write_bytes(data)
        assert image_jpeg.simple_jpeg(str(path), how.size) is None and not decoded, kind
        with monkeypatch.context() as m:
            m.setattr(image_jpeg, "simple_jpeg", lambda path, size=None: None)
            expected = failure(path, how)
        assert failure(path, how) == expected, kind
        if not expected:  # Pillow reads it: so do we, alike
            np.testing.assert_array_equal(image_decode.decode(path, how), pillow_only(path, how, monkeypatch))


def damaged(tmp_path) -> dict[str, bytes]:
    """Files whose header is fine and whose data is not: the fast path's decode fails or reads what
    Image.open reads."""
    good = save(tmp_path / "good.jpg", size=(40, 48)).read_bytes()
    scan = len(good) - len(segments(good)[-1][1])
    flipped = bytearray(good)
    flipped[scan + 40:scan + 60] = bytes(rng.integers(0, 255, 20, dtype=np.uint8))
    return {"truncated in the scan": good[:scan + (len(good) - scan) // 2], "no EOI": good[:-2],
            "truncated in the header": good[:scan - 30], "damaged scan": bytes(flipped), "empty": b"",
            "garbage after EOI": good + b"garbage", "scan all zeros": good[:scan + 14] + bytes(len(good) - scan - 16)
            + b"\xff\xd9"}


@pytest.mark.parametrize("truncated_ok", [False, True])
def test_damaged_jpegs_fail_as_pillow_says(tmp_path, monkeypatch, truncated_ok):
    """Each damaged file gives Image.open's error text or pixels, with ImageFile.LOAD_TRUNCATED_IMAGES
    off (truncated: an error) and on (truncated: what was decoded)."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", truncated_ok)
    how = Decoding((40, 48), "rgb", "stretch")
    outcomes = set()
    for kind, data in damaged(tmp_path).items():
        path = tmp_path / f"{kind}.jpg"
        path.write_bytes(data)
        with monkeypatch.context() as m:
            m.setattr(image_jpeg, "simple_jpeg", lambda path, size=None: None)
            expected = failure(path, how)
        assert failure(path, how) == expected, kind
        outcomes.add(bool(expected))
        if not expected:
            np.testing.assert_array_equal(image_decode.decode(path, how), pillow_only(path, how, monkeypatch),
                                          err_msg=kind)
    assert outcomes == {True, False}  # some fail, some are read


def test_a_truncated_jpeg_is_refused_as_before(tmp_path):
    path = tmp_path / "t.jpg"
    path.write_bytes(save(tmp_path / "good.jpg", size=(40, 48)).read_bytes()[:-200])
    failed = failure(path, Decoding((40, 48), "rgb", "stretch"))
    assert len(failed) == 1 and failed[0][1].startswith("truncated: image file is truncated")


def test_a_jpeg_over_the_bomb_limit_is_refused_as_before(tmp_path, monkeypatch, decoded):
    path = save(tmp_path / "x.jpg", size=(20, 20))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    failed = failure(path, Decoding((20, 20), "rgb", "stretch"))
    assert len(failed) == 1 and "decompression-bomb limit" in failed[0][1] and not decoded
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert not failure(path, Decoding((20, 20), "rgb", "stretch")) and decoded


def test_a_jpeg_named_otherwise_is_read_by_image_open(tmp_path, monkeypatch):
    """The fast path is chosen by suffix; a JPEG named .png, or a PNG named .jpg, is read as before."""
    how = Decoding((17, 31), "rgb", "stretch")
    as_png = tmp_path / "x.png"
    as_png.write_bytes(save(tmp_path / "x.jpg").read_bytes())
    buf = io.BytesIO()
    picture().save(buf, "PNG")
    as_jpg = tmp_path / "y.jpg"
    as_jpg.write_bytes(buf.getvalue())
    for path in (as_png, as_jpg):
        np.testing.assert_array_equal(image_decode.decode(path, how), pillow_only(path, how, monkeypatch))
