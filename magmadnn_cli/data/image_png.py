"""The PNG files most folders hold, decoded without Image.open: 8-bit grayscale, RGB or RGBA, not
interlaced, no palette or transparency, and only chunks that change no pixel. The file is read in
one system call, its chunks walked here (with the checks Pillow's parser makes: names, lengths, the
CRC of each chunk before the pixel data) and the pixel data inflated and unfiltered by Pillow's own
zip decoder (`Image.frombytes(..., "zip", rawmode)`, what `ImageFile.load` calls), skipping the plugin
search, the parser and the read loop: ~30 against ~48 us a 32x32 RGB file. Anything else (another
kind or format, a text or ICC chunk, a damaged file, an image over the decompression-bomb limit)
returns None and is decoded by Image.open as before: the same pixels, the same messages."""

from __future__ import annotations

import os
import stat
import struct
import zlib

try:
    from PIL import Image, PngImagePlugin
except ImportError:  # the [images] extra
    Image = PngImagePlugin = None  # type: ignore[assignment]

SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMALL_BYTES = 1 << 22  # files read whole here (4 MiB); larger ones go to Image.open
MODES = {0: "L", 2: "RGB", 6: "RGBA"}  # the PNG colour types read here (8 bits a sample)
# chunks Pillow reads into im.info (no pixel changes), with the least length it accepts
SHORTEST = {b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9}


def simple_png(path: str | os.PathLike) -> "Image.Image | None":
    """The file's image (mode L, RGB or RGBA) where it is such a PNG, else None."""
    data = read_whole(path)
    if data[:8] != SIGNATURE or data[12:16] != b"IHDR" or len(data) < 33:
        return None
    width, height, depth, kind, compression, filtering, interlace = struct.unpack_from(">IIBBBBB", data, 16)
    limit = Image.MAX_IMAGE_PIXELS
    if depth != 8 or kind not in MODES or compression or filtering or interlace or not width or not height or \
            (limit is not None and width * height > limit):
        return None
    pixels = _pixel_data(data)
    if pixels is None:
        return None
    try:
        return Image.frombytes(MODES[kind], (width, height), pixels, "zip", MODES[kind])
    except (ValueError, OSError, zlib.error):  # short or damaged pixel data: Pillow's open says how
        return None


def read_whole(path: str | os.PathLike) -> bytes:
    """The file's bytes, in one read (one system call), where it holds at most SMALL_BYTES; else none
    (b""): a large file is left to Image.open, which reads its header first (the decompression-bomb
    check, a JPEG's draft) and decodes it whole for much longer than the parse saved here costs."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a named pipe: opened, not waited on
    try:
        st = os.fstat(fd)
        regular(st)
        return os.read(fd, st.st_size + 1) if st.st_size <= SMALL_BYTES else b""
    finally:
        os.close(fd)


def regular(st: os.stat_result) -> None:
    """Refuse what is not a regular file (reading a named pipe waits for a writer for ever)."""
    if not stat.S_ISREG(st.st_mode):
        kind = "a named pipe" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else \
            "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise OSError(f"not a regular file ({kind})")


def _pixel_data(data: bytes) -> bytes | None:
    """The IDAT chunks' bytes joined, where every chunk is whole, named as PNG names them, one Pillow
    reads without a pixel change, those before the pixel data have their CRC right, the IDAT chunks
    come in one run, and IEND ends them; else None."""
    pos, parts, state = 8, [], "before"  # before the pixel data, in it, after it
    while pos + 12 <= len(data):
        length, cid = struct.unpack_from(">I4s", data, pos)
        body = data[pos + 8:pos + 8 + length]
        if pos + 12 + length > len(data) or not _plain(cid, length) or (cid == b"IHDR") != (pos == 8):
            return None
        if cid == b"IDAT":
            if state == "after":
                return None
            state = "in"
            parts.append(body)
        elif cid == b"IEND":
            return b"".join(parts) if parts else None
        else:
            state = "after" if state == "in" else state
        if state == "before" and zlib.crc32(data[pos + 4:pos + 8 + length]) != _u32(data, pos + 8 + length):
            return None
        pos += 12 + length
    return None


def _plain(cid: bytes, length: int) -> bool:
    """Whether Pillow reads a chunk without changing a pixel or failing: the image's own chunks, one
    of SHORTEST as long as it needs, or one Pillow has no reader for (skipped)."""
    if not cid.isalpha():
        return False
    if cid in (b"IHDR", b"IDAT", b"IEND"):
        return cid != b"IHDR" or length == 13
    if cid in SHORTEST:
        return length >= SHORTEST[cid]
    return not hasattr(PngImagePlugin.PngStream, f"chunk_{cid.decode('ascii')}")


def _u32(data: bytes, pos: int) -> int:
    return struct.unpack_from(">I", data, pos)[0]
