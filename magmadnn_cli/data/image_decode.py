"""Decoding image files into uint8 pixels (C, H, W) with Pillow: one size, one colour mode, 8- and
16-bit, palettes and alpha. Runs in the decoding worker processes too, so it imports only numpy and
Pillow; a file that cannot be decoded is returned as a message naming it, not raised.

A JPEG at least 4x larger than the size asked for (in both dimensions) is decoded by libjpeg at 1/2,
1/4 or 1/8 scale, still at least twice the size, before the resize (`Image.draft`, as Pillow's own
thumbnail does): several times faster, pixels within a level or two of a full decode + resize. Every
path that decodes (a folder, a path column, predict, evaluate, serve) goes through `decode_into`, so a
model sees the same pixels everywhere."""

from __future__ import annotations

import contextlib
import os
import signal
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..config.names import FORMATS
from . import image_jpeg, image_png

try:
    from PIL import Image, ImageOps
except ImportError:  # the [images] extra
    Image = ImageOps = None  # type: ignore[assignment]

SUFFIXES = FORMATS["image_file"].suffixes  # as declared in config/names.py
MODES = {"grayscale": "L", "rgb": "RGB", "rgba": "RGBA"}
CHANNELS = {"grayscale": 1, "rgb": 3, "rgba": 4}
WIDE = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")        # more than 8 bits a pixel: rescaled to 8
GRAY = ("1", "L", *WIDE)
ALPHA = ("RGBA", "LA", "PA", "La", "RGBa")
DRAFTED = ("JPEG", "MPO")    # formats libjpeg can decode at a reduced scale
Block = tuple[int, "np.ndarray | None", list[tuple[int, str]], np.ndarray]  # start, pixels, failed, stamps after


@dataclass(frozen=True)
class Decoding:
    """What every image becomes: `size` (height, width), `color` (grayscale, rgb, rgba), and how
    another size is met (`resize`: stretch, crop, pad)."""
    size: tuple[int, int]
    color: str
    resize: str

    @property
    def shape(self) -> tuple[int, int, int]:
        return (CHANNELS[self.color], *self.size)


def first_look(path: Path) -> tuple[tuple[int, int], str]:
    """The (height, width) and colour (grayscale, rgb, rgba) of an image, from its header."""
    with bombs_refused(), _opened(path) as im:
        alpha = im.mode in ALPHA or (im.mode == "P" and "transparency" in im.info)
        return (im.height, im.width), "rgba" if alpha else "grayscale" if im.mode in GRAY else "rgb"


def decode(path: Path, how: Decoding) -> np.ndarray:
    """The image's pixels as uint8 (C, H, W), in `how`'s colours and size."""
    hwc = np.empty((*how.size, how.shape[0]), np.uint8)
    with bombs_refused():
        decode_into(path, how, hwc)
    return hwc.transpose(2, 0, 1).copy()


def decode_into(path: Path | str, how: Decoding, hwc: np.ndarray) -> None:
    """The image's pixels into `hwc` (H, W, C) uint8: a simple PNG or JPEG read by `image_png` or
    `image_jpeg`, any other file opened by Pillow (a large JPEG drafted); coloured, resized, copied once."""
    with _simple(path, how) or _opened(path) as im:
        _drafted(im, how)
        im = _resized(_colored(im, how.color), how)
        hwc[...] = np.frombuffer(im.tobytes(), np.uint8).reshape(hwc.shape)


def _simple(path: Path | str, how: Decoding) -> "Image.Image | None":
    """The file decoded without Image.open where its suffix and kind allow (else None)."""
    name = str(path).lower()
    if name.endswith(".png"):
        return image_png.simple_png(path)
    return image_jpeg.simple_jpeg(path, how.size) if name.endswith(image_jpeg.SUFFIXES) else None


def decode_block(start: int, paths: list[str], how: Decoding, into: str | None = None) -> Block:
    """Images `start`, ... of a listing decoded (zeros where a file fails): written into those rows of
    the uint8 .npy file `into` (memory-mapped: the pixels never travel back to the caller) or returned
    as one array (N, C, H, W); the files that failed (position, why); and each file's (size,
    modification time) taken after it was decoded (to find a file that changed meanwhile)."""
    hwc = np.zeros((len(paths), *how.size, how.shape[0]), np.uint8)
    failed = []
    with bombs_refused():
        for i, path in enumerate(paths):
            try:
                decode_into(path, how, hwc[i])
            except Exception as exc:  # noqa: BLE001  every failure of a file is reported with its path
                hwc[i] = 0
                failed.append((start + i, why(exc)))
    after, pixels = stamps(paths), hwc.transpose(0, 3, 1, 2)  # one transpose a block, not one an image
    if into is None:
        return start, np.ascontiguousarray(pixels), failed, after
    out = np.load(into, mmap_mode="r+")
    out[start:start + len(paths)] = pixels
    del out  # unmapped: written to the file's pages, which every process mapping it shares
    return start, None, failed, after


STAMPS = 4  # a file's stamp: size, modification time, status change time (ns), inode


def stamps(files: list[str]) -> np.ndarray:
    """Each file's (size, modification time, status change time in ns, inode); -1s for a file that is
    gone. The change time is set by every write and no call sets it back, so a file rewritten with its
    size and modification time kept (touch -r, rsync -t, a restore) differs too."""
    out = np.full((len(files), STAMPS), -1, np.int64)
    for i, path in enumerate(files):  # one stat a file: the system call is the cost, not the loop
        with contextlib.suppress(OSError):
            st = os.stat(path)
            out[i] = st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    return out


def check(path: Path) -> None:
    """Raise where Pillow cannot read the image, found as cheaply as its format allows: the header
    opened, then a PNG's chunks and checksums verified (nothing inflated), a JPEG decoded at an eighth
    of its size (its entropy-coded data read through), another format decoded."""
    with bombs_refused(), _opened(path) as im:
        if im.format == "PNG":
            im.verify()
            return
        if im.format == "JPEG":
            im.draft(im.mode, (max(1, im.width // 8), max(1, im.height // 8)))
        im.load()


def check_block(start: int, paths: list[str]) -> tuple[int, list[tuple[int, str]]]:
    """The files of images `start`, ... that fail `check`: their positions and why."""
    failed = []
    for i, path in enumerate(paths):
        try:
            check(Path(path))
        except Exception as exc:  # noqa: BLE001  every failure of a file is reported with its path
            failed.append((start + i, why(exc)))
    return start, failed


def quiet_worker() -> None:
    """A decoding worker leaves Ctrl-C to the command (which stops the pool), printing nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def why(exc: Exception) -> str:
    """A decoding failure in words."""
    if Image is not None and isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return (f"over Pillow's decompression-bomb limit: {exc} (a hostile file, or an image far larger than "
                "training needs: shrink it first)")  # Pillow's numbers, once
    if isinstance(exc, FileNotFoundError) and exc.filename and os.path.islink(exc.filename):
        return f"a broken symbolic link (to {os.readlink(exc.filename)})"
    if Image is not None and isinstance(exc, Image.UnidentifiedImageError):  # its text repeats the path
        return "cannot identify image file (empty, or not in an image format Pillow reads)"
    if isinstance(exc, (OSError, SyntaxError, ValueError)) and "truncated" in str(exc).lower():
        return f"truncated: {exc}"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)


@contextlib.contextmanager
def bombs_refused() -> Iterator[None]:
    """Within it, an image over Pillow's decompression-bomb limit is an error, not a warning (set once
    for a block of files: the filter is process-wide state, costly to set per file)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        yield


def _opened(path: Path | str) -> "Image.Image":
    """The file (or serve's upload) opened lazily (the first frame of an animation); a path that is not
    a regular file refused."""
    if isinstance(path, (str, os.PathLike)):
        image_png.regular(os.stat(path))
    return Image.open(path)


def _drafted(im: "Image.Image", how: Decoding) -> None:
    """A JPEG at least 4x larger than `how.size` in both dimensions set to be decoded by libjpeg at
    1/2, 1/4 or 1/8 scale, still at least twice the size (the recipe: im.draft(None, (2 * W, 2 * H)))."""
    height, width = how.size
    if im.format in DRAFTED and image_jpeg.drafted(im.width, im.height, how.size):
        im.draft(None, (2 * width, 2 * height))


def _colored(im: "Image.Image", color: str) -> "Image.Image":
    """The image in mode L, RGB or RGBA; 16-bit (and 32-bit) gray rescaled to 8 bits, a palette's
    transparency kept as alpha."""
    if im.mode in WIDE:
        values = np.asarray(im)
        if im.mode == "F":
            eight = np.clip(np.round(values), 0, 255)
        else:
            eight = (np.clip(values.astype(np.int64), 0, 65535) * 255 + 32767) // 65535
        im = Image.fromarray(eight.astype(np.uint8), "L")
    elif im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    mode = MODES[color]
    return im if im.mode == mode else im.convert(mode)


def _resized(im: "Image.Image", how: Decoding) -> "Image.Image":
    """The image at how.size: stretched, or its centre cropped or the image padded with black to the
    size's aspect ratio, then resized (bilinear, antialiased)."""
    height, width = how.size
    if im.size == (width, height):
        return im
    if how.resize == "crop":
        return ImageOps.fit(im, (width, height), Image.Resampling.BILINEAR)
    if how.resize == "pad":
        return ImageOps.pad(im, (width, height), Image.Resampling.BILINEAR)
    return im.resize((width, height), Image.Resampling.BILINEAR)
