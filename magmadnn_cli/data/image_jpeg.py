"""The JPEG files most folders hold, decoded without Image.open: 8-bit grayscale or RGB, baseline,
extended or progressive (Huffman), not drafted. The file is read in one system call, its segments up
to the scan walked here (with the checks Pillow's parser makes that could fail it: lengths, the
quantization tables, the frame) and the whole file handed to Pillow's own jpeg decoder with the mode
and raw mode JpegImagePlugin gives it (`Image.frombytes(..., "jpeg", rawmode, "")`, what
`ImageFile.load` calls on the same bytes), skipping the plugin search, the parser and the read loop:
~36 against 52-66 us a 32x32 RGB file. Anything else returns None and is decoded by Image.open as
before, the same pixels and messages: another frame type or precision, CMYK, an Adobe, EXIF, MPF or
Photoshop segment (which Pillow's parser reads in ways that can fail or pick another frame), a
marker out of place, an image over the decompression-bomb limit or one `drafted` would shrink, and
any file the decoder does not finish (truncated or damaged: ImageFile.LOAD_TRUNCATED_IMAGES is then
Image.open's to apply)."""

from __future__ import annotations

import os
import struct

from .image_png import read_whole

try:
    from PIL import Image
except ImportError:  # the [images] extra
    Image = None  # type: ignore[assignment]

SUFFIXES = (".jpg", ".jpeg", ".jfif")
MODES = {1: "L", 3: "RGB"}      # components -> mode (and raw mode), as JpegImagePlugin maps them
FRAMES = (0xC0, 0xC1, 0xC2)     # baseline, extended sequential, progressive (Huffman coded)
SKIPPED = (0xC4, 0xDD, 0xFE)    # DHT, DRI, COM: read past by Pillow, checked by libjpeg
DQT, SOS, APP14 = 0xDB, 0xDA, 0xEE
# APPn segments by (marker, prefix): the least length Pillow's parser reads without failing (shorter:
# Image.open fails); None: read in ways that may fail or change the frame Image.open decodes
APPS = {(0xE0, b"JFIF"): 7, (0xE2, b"ICC_PROFILE\0"): 14, (0xE1, b"Exif\0\0"): None, (0xE2, b"MPF\0"): None,
        (0xED, b"Photoshop 3.0\0"): None}


def simple_jpeg(path: str | os.PathLike, size: tuple[int, int] | None = None) -> "Image.Image | None":
    """The file's image (mode L or RGB) where it is such a JPEG, not drafted to `size` (height,
    width: the size it is decoded for), else None."""
    data = read_whole(path)
    frame = _frame(data)
    if frame is None:
        return None
    width, height, mode = frame
    limit = Image.MAX_IMAGE_PIXELS
    if (limit is not None and width * height > limit) or (size is not None and drafted(width, height, size)):
        return None
    try:
        return Image.frombytes(mode, (width, height), data, "jpeg", mode, "")
    except (ValueError, OSError):  # truncated or damaged: Image.open says how (or loads it truncated)
        return None


def drafted(width: int, height: int, size: tuple[int, int]) -> bool:
    """Whether an image of width x height is at least 4x `size` (height, width) in both dimensions:
    decoded by libjpeg at 1/2, 1/4 or 1/8 scale (image_decode's draft)."""
    return min(width // (2 * size[1]), height // (2 * size[0])) >= 2


def _frame(data: bytes) -> tuple[int, int, str] | None:
    """(width, height, mode) of the one frame, where SOI opens the file, every segment up to the scan
    is whole, comes right after the one before and is one `_plain` accepts; else None."""
    if data[:2] != b"\xff\xd8":
        return None
    pos, frame = 2, None
    while pos + 4 <= len(data):
        marker, length = data[pos + 1], _u16(data, pos + 2)
        body = data[pos + 4:pos + 2 + length]
        if data[pos] != 0xFF or pos + 2 + length > len(data) or not _plain(marker, body):  # length < 2: no 0xFF next
            return None
        if marker == SOS:
            return frame
        if marker in FRAMES:
            if frame is not None:
                return None
            frame = _sof(body)
            if frame is None:
                return None
        pos += 2 + length
    return None


def _plain(marker: int, body: bytes) -> bool:
    """Whether a segment before the scan is one Pillow's parser reads without failing or changing
    what it decodes."""
    if marker in FRAMES or marker in SKIPPED or marker == SOS:
        return True
    if marker == DQT:
        return _tables_whole(body)
    if 0xE0 <= marker <= 0xEF:
        return marker != APP14 and _app_read(marker, body)
    return False


def _app_read(marker: int, body: bytes) -> bool:
    """Whether Pillow's parser reads an APPn segment (not Adobe's) without failing or changing the frame."""
    for (known, prefix), least in APPS.items():
        if known == marker and body.startswith(prefix):
            return least is not None and len(body) >= least
    return True


def _tables_whole(body: bytes) -> bool:
    """Whether a DQT segment holds whole tables (Pillow refuses a short one)."""
    pos = 0
    while pos < len(body):
        pos += 1 + 64 * (1 if body[pos] < 16 else 2)
        if pos > len(body):
            return False
    return True


def _sof(body: bytes) -> tuple[int, int, str] | None:
    """(width, height, mode) from a frame header of 8-bit samples, 1 or 3 components, exactly as long
    as its components need; else None."""
    precision, height, width, count = struct.unpack_from(">BHHB", body) if len(body) >= 6 else (0, 0, 0, 0)
    if precision != 8 or count not in MODES or len(body) != 6 + 3 * count or not width or not height:
        return None
    return width, height, MODES[count]


def _u16(data: bytes, pos: int) -> int:
    return (data[pos] << 8) | data[pos + 1]
