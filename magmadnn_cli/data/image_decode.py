"""Decoding image files into uint8 pixels (C, H, W) with Pillow: one size, one colour mode, 8- and
16-bit, palettes and alpha. Runs in the decoding worker processes too, so it imports only numpy and
Pillow; a file that cannot be decoded is returned as a message naming it, not raised."""

from __future__ import annotations

import signal
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.names import FORMATS

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
    with _opened(path) as im:
        alpha = im.mode in ALPHA or (im.mode == "P" and "transparency" in im.info)
        return (im.height, im.width), "rgba" if alpha else "grayscale" if im.mode in GRAY else "rgb"


def decode(path: Path, how: Decoding) -> np.ndarray:
    """The image's pixels as uint8 (C, H, W), in `how`'s colours and size."""
    with _opened(path) as im:
        im.load()
        im = _resized(_colored(im, how.color), how)
        pixels = np.asarray(im, dtype=np.uint8)
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def decode_block(start: int, paths: list[str], how: Decoding) -> tuple[int, np.ndarray, list[tuple[int, str]]]:
    """Images `start`, ... of a listing as one uint8 array (zeros where a file fails), and the
    files that failed: their positions and why."""
    out = np.zeros((len(paths), *how.shape), np.uint8)
    failed = []
    for i, path in enumerate(paths):
        try:
            out[i] = decode(Path(path), how)
        except Exception as exc:  # noqa: BLE001  every failure of a file is reported with its path
            failed.append((start + i, why(exc)))
    return start, out, failed


def check(path: Path) -> None:
    """Raise where Pillow cannot read the image, found as cheaply as its format allows: the header
    opened, then a PNG's chunks and checksums verified (nothing inflated), a JPEG decoded at an eighth
    of its size (its entropy-coded data read through), another format decoded."""
    with _opened(path) as im:
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
        return (f"more pixels than Pillow's decompression-bomb limit ({Image.MAX_IMAGE_PIXELS:,}): {exc} (a hostile "
                "file, or an image far larger than training needs: shrink it first)")
    if Image is not None and isinstance(exc, Image.UnidentifiedImageError):  # its text repeats the path
        return "cannot identify image file (empty, or not in an image format Pillow reads)"
    if isinstance(exc, (OSError, SyntaxError, ValueError)) and "truncated" in str(exc).lower():
        return f"truncated: {exc}"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)


def _opened(path: Path) -> "Image.Image":
    """The file opened lazily (the first frame of an animation); an image over Pillow's
    decompression-bomb limit is an error, not a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(path)


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
