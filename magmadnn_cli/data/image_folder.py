"""A folder of class folders of image files (`train/<class>/*.png`, the layout Keras'
`image_dataset_from_directory` and torchvision's `ImageFolder` read) as data: labels are the folder
names, sorted; nested folders are read; other files are ignored and counted once. Files are decoded
with Pillow in this process and worker processes (data.image.workers, default every core: `image_pool`),
in a fixed order."""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..config.data import ImageSettings
from ..core import backend as B
from ..errors import DataError
from . import image_cache, image_decode
from .image_pool import in_blocks
from .columns import RawColumns
from .image_decode import SUFFIXES, Decoding, decode_block, first_look
from .pixels import settle_eight_bit
from .table import ReadSpec, Table, typed_labels

SHOWN = 3                 # ignored files named in the note
SAMPLED = 64              # files spread over a listing whose headers give data.image's default size and colours
COLORS = ("grayscale", "rgb", "rgba")  # narrower to wider
SKIPPED_SHOWN = 20        # skipped files listed with why
PROGRESS_EVERY_S = 2.0    # a decode taking longer says how far it is, at most this often

_progress: ContextVar[Callable[[str], None] | None] = ContextVar("image_progress", default=None)
_looking: ContextVar[str] = ContextVar("image_looking", default="")  # "look", or "check" (validate)


@contextlib.contextmanager
def decode_progress(say: Callable[[str], None]) -> Iterator[None]:
    """Within it, a folder whose decoding takes longer than PROGRESS_EVERY_S reports progress lines
    through `say` (the command's reporter)."""
    token = _progress.set(say)
    try:
        yield
    finally:
        _progress.reset(token)


@contextlib.contextmanager
def looking_only(check: bool = False) -> Iterator[None]:
    """Within it (summary, validate), a folder is listed, not decoded: the size and colours come from
    a sample of the headers (or data.image), every sample stands for one image of them (the same
    shape and count), nothing is cached. Summary decodes none (black pixels stand in); with `check`
    (validate) every file is also checked cheaply (`check_all`), each bad one named, and the first
    one decoded."""
    token = _looking.set("check" if check else "look")
    try:
        yield
    finally:
        _looking.reset(token)


class Progress:
    """'decoding <root>: done of total (share), rate, time left', said at most every PROGRESS_EVERY_S."""

    def __init__(self, root: Path, total: int) -> None:
        self.root, self.total, self.say = root, total, _progress.get()
        self.started = self.last = time.perf_counter()

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if self.say is None or now - self.last < PROGRESS_EVERY_S or done >= self.total:
            return
        self.last, rate = now, done / (now - self.started)
        self.say(f"decoding {self.root}: {done:,} of {self.total:,} images ({done / self.total:.0%}), "
                 f"{rate:,.0f} images/s, about {(self.total - done) / rate:,.0f} s left")


@dataclass
class Listing:
    """The image files of a class-folder layout, in order, with their class names; the files left out."""
    files: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def is_image_file(path: Path | str) -> bool:
    return os.path.basename(path).lower().endswith(SUFFIXES)


def list_classes(root: Path) -> Listing:
    """Every image file under each class folder of `root` (folders sorted by name, files walked in
    sorted order), the class folders, and the other files (not images, or outside a class folder)."""
    listing = Listing()
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if not entry.is_dir() or _hidden(entry.name):  # hidden folders (.ipynb_checkpoints) are no class
            listing.ignored.append(entry.path)
            continue
        _check_name(root, entry.name)
        before = len(listing.files)
        _walk(entry.path, listing)
        listing.labels += [entry.name] * (len(listing.files) - before)
        listing.classes.append(entry.name)
        if len(listing.files) == before:
            raise DataError(f"{Path(entry.path)}: a class folder with no image files ({', '.join(SUFFIXES)}); add its "
                            "images, or remove the folder (every subfolder of the data folder is a class)")
    if not listing.files:
        loose = any(is_image_file(Path(p)) for p in listing.ignored)
        raise DataError(f"{root}: is a directory " + ("of images, but not in class folders: put each class's images "
                        "in a subfolder named after the class (train/<class>/*.png)" if loose else
                        "with no class folders of images; expected a data file, or a folder holding one subfolder "
                        "of images per class (train/<class>/*.png)"))
    return listing


def list_images(root: Path) -> Listing:
    """Every image file under `root` (a folder, walked in sorted order, or one image file), unlabelled:
    what predict reads (class folders or not); the other files left out."""
    listing = Listing()
    if root.is_file():
        listing.files.append(str(root))
    elif root.is_dir():
        _walk(str(root), listing)
    if not listing.files:
        raise DataError(f"{root}: no image files ({', '.join(SUFFIXES)}) in it or its folders")
    listing.labels = [""] * len(listing.files)
    return listing


def _walk(top: str, listing: Listing) -> None:
    """The files under `top` (hidden folders skipped, everything in sorted order) into `listing`: image
    files to read, the others (hidden files too) ignored."""
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for name in sorted(names):
            path = os.path.join(folder, name)
            (listing.ignored if _hidden(name) or not name.lower().endswith(SUFFIXES) else listing.files).append(path)


def _hidden(name: str) -> bool:
    """A hidden file or folder (.DS_Store, .ipynb_checkpoints, macOS's AppleDouble ._x.png) or the
    __MACOSX folder a Mac's zip archives hold: never an image or a class."""
    return name.startswith(".") or name == "__MACOSX"


def _unreadable(path: str, why: str) -> DataError:
    """A file Pillow cannot decode, named, with the fix."""
    return DataError(f"{Path(path)}: cannot read as an image: {why}; fix or remove the file (or "
                     "data.image.on_error: skip)")


def _check_name(root: Path, name: str) -> None:
    """A class folder's name must be text (it becomes the label)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(f"{root}: the class folder {name.encode('utf-8', 'surrogateescape')!r} is not named in valid "
                        "UTF-8; rename it (its name is the class's label)") from None


def decoding(listing: Listing, settings: ImageSettings | None, root: Path | str = "") -> tuple[Decoding, list[str]]:
    """data.image resolved: the size and colours not given are those most of a sample of the files'
    headers have (`_sampled`; the size: the first image's where none is more common; the colours,
    tied: the wider, which loses nothing), and the notes where the sample differs."""
    settings = settings or ImageSettings()
    size, color = tuple(settings.size) if settings.size else None, settings.color
    if size is not None and color != "auto":
        return Decoding((int(size[0]), int(size[1])), color, settings.resize), []
    looks = _sampled(listing.files, settings.on_error == "skip")
    sizes, colors, notes = Counter(s for s, _ in looks), Counter(c for _, c in looks), []
    if size is None:
        size = sizes.most_common(1)[0][0]  # ties: the first seen, the first image's
        notes += [_sizes_note(root, sizes, size, settings.resize)] if len(sizes) > 1 else []
    if color == "auto":
        color = max(colors, key=lambda c: (colors[c], COLORS.index(c)))
        notes += [_colors_note(root, colors, color)] if len(colors) > 1 else []
    return Decoding((int(size[0]), int(size[1])), color, settings.resize), notes


def _sampled(files: list[str], skip: bool) -> list[tuple[tuple[int, int], str]]:
    """The (height, width) and colours of up to SAMPLED files spread over the listing, the first one
    included (unreadable without `skip`: refused, named); another unreadable file is left to the
    decode, which names it. None read: the first readable file's, as far as `skip` looks."""
    looks = []
    for at in sorted({round(k) for k in np.linspace(0, len(files) - 1, min(len(files), SAMPLED))}):
        try:
            looks.append(first_look(Path(files[at])))
        except Exception as exc:
            if at == 0 and not skip:
                raise _unreadable(files[0], image_decode.why(exc)) from exc
    return looks or [_first_readable(files, skip)]


def _sizes_note(root: Path | str, sizes: Counter, size: tuple[int, int], resize: str) -> str:
    shown, counts = sorted(sizes, key=lambda s: s[0] * s[1]), sorted(sizes.values())
    why = f"the most common ({sizes[size]} of them)" if counts[-1] > counts[-2] else \
        "the first image's, none more common"
    return (f"{root}: the images differ in size (a sample of {sum(counts)} has {len(sizes)} sizes, "
            f"{shown[0][0]}x{shown[0][1]} to {shown[-1][0]}x{shown[-1][1]}): each is resized to {size[0]}x{size[1]}, "
            f"{why} (data.image.resize: {resize}); set data.image.size: [H, W] to choose")


def _colors_note(root: Path | str, colors: Counter, color: str) -> str:
    counts = ", ".join(f"{n} {c}" for c, n in colors.most_common())
    return (f"{root}: the images differ in colours (a sample of {sum(colors.values())}: {counts}): all are decoded "
            f"as {color}, the most common (tied: the wider); set data.image.color to choose")


def _first_readable(files: list[str], skip: bool) -> tuple[tuple[int, int], str]:
    """The size and colours of the first file (with `skip`: the first one Pillow opens)."""
    for path in files:
        try:
            return first_look(Path(path))
        except Exception as exc:
            if not skip:
                raise _unreadable(path, image_decode.why(exc)) from exc
    raise DataError(f"{Path(files[0]).parent.parent}: no image of the {len(files):,} files could be read "
                    "(data.image.on_error: skip)")


def _first_pixels(files: list[str], how: Decoding, skip: bool) -> np.ndarray:
    """The first file's pixels (with `skip`: the first one that decodes)."""
    for path in files:
        _, block, failed, _ = decode_block(0, [path], how)
        if not failed:
            return block[0]
        _refuse_first([path], failed, skip)
    raise DataError(f"{Path(files[0]).parent.parent}: no image of the {len(files):,} files could be read "
                    "(data.image.on_error: skip)")


def decode_all(listing: Listing, how: Decoding, workers: int | None, skip: bool = False,
               progress: Callable[[int], None] = lambda done: None, out: np.ndarray | None = None,
               into: str | None = None) -> tuple[list[tuple[int, str]], np.ndarray]:
    """Every listed file decoded into `out` (N, C, H, W) uint8, in listing order (`in_blocks`): by the
    decoders straight into the .npy file `into` (which `out` maps) where given, else sent back here;
    the files that failed (position, why; without `skip` the first one is refused, naming it) and
    each file's (size, time) once decoded. The pixels do not depend on the number of processes."""
    if out is None:
        out = np.empty((len(listing.files), *how.shape), np.uint8)
    with contextlib.closing(in_blocks(decode_block, listing.files, (how, into), workers)) as decoded:
        return _gathered(out, decoded, listing.files, skip, progress)


def check_all(listing: Listing, workers: int | None) -> list[tuple[int, str]]:
    """The listed files that Pillow cannot read (position, why), each checked cheaply
    (`image_decode.check`: no file decoded whole), in `in_blocks` as decoding runs."""
    with contextlib.closing(in_blocks(image_decode.check_block, listing.files, (), workers)) as checked:
        return [bad for _, (_, failed) in checked for bad in failed]


def _gathered(out: np.ndarray, results: Any, files: list[str], skip: bool,
              progress: Callable[[int], None]) -> tuple[list[tuple[int, str]], np.ndarray]:
    """The blocks sent back put in place; the failures (the first one refused without `skip`), and
    every file's stamps after decoding; the files done so far said to `progress`."""
    failed: list[tuple[int, str]] = []
    after = np.empty((len(files), image_decode.STAMPS), np.int64)
    for done, (start, block, bad, stamped) in results:
        if block is not None:
            out[start:start + len(block)] = block
        after[start:start + len(stamped)] = stamped
        _refuse_first(files, bad, skip)
        failed += bad
        progress(done)
    return failed, after


def _refuse_first(files: list[str], failed: list[tuple[int, str]], skip: bool) -> None:
    """Without `skip`, the first file that failed is refused, named."""
    if failed and not skip:
        where, message = failed[0]
        raise _unreadable(files[where], message)


@dataclass
class ReadImages:
    """Listed files read: which were kept, their pixels (N, C, H, W) in the run's float type, the notes
    on the cache and the files skipped, and data.image resolved (the size and colours decoded)."""
    keep: np.ndarray
    x: np.ndarray
    notes: list[str]
    settings: ImageSettings

    def settle(self, settled: dict[str, Any], spec: ReadSpec) -> None:
        """What the model saves of the read (so predict decodes alike): data.image resolved, and the
        scale 8-bit pixels get by default."""
        settled["image"] = self.settings
        settle_eight_bit(settled, np.uint8, self.x.ndim, spec.data)


def read_image_folder(root: Path, spec: ReadSpec) -> Table:
    """The images under `root`'s class folders as a table of (N, C, H, W) samples labelled by folder;
    the resolved data.image settled (validation and test folders, and predict, decode alike)."""
    listing = list_classes(root) if spec.need_target else list_images(root)
    settings = (spec.data.image if spec.data is not None else None) or ImageSettings()
    read = decoded_listing(root, listing, settings, spec)
    labels = typed_labels(np.array(listing.labels)[read.keep]) if spec.need_target else None
    paths = np.array(_shown(root, listing.files), dtype=object)[read.keep]
    table = Table(RawColumns(read.x), labels, [f"pixel{i}" for i in range(int(np.prod(read.x.shape[1:])))],
                  str(root), kept={"path": paths}, notes=_notes(root, listing, read.x.shape[1:]) + read.notes)
    read.settle(table.settled, spec)
    return table


def decoded_listing(root: Path, listing: Listing, settings: ImageSettings, spec: ReadSpec) -> ReadImages:
    """The listed files decoded (N, C, H, W) in the run's float type (`root`: the folder or table
    named). Within `looking_only(check=True)` (validate) every file is checked, none decoded whole."""
    if image_decode.Image is None:
        raise DataError(f"{root}: reading image files needs Pillow: pip install 'magmadnn-cli[images]' (make install "
                        "has it)")
    skip = settings.on_error == "skip"
    checked = _checked(root, listing, settings.workers, skip)
    how, defaults = decoding(listing, settings, root)
    dtype = np.dtype(spec.dtype or B.current().floatx)
    B.require_memory(len(listing.files) * int(np.prod(how.shape)) * (1 + dtype.itemsize),
                     f"{root}: {len(listing.files):,} decoded images of {' x '.join(map(str, how.shape))} (set "
                     "data.image.size to decode them smaller, e.g. [64, 64])", on_host=True)
    pixels, failed, said = _pixels(root, listing, how, settings, checked)
    keep = np.ones(len(pixels), bool)
    keep[[where for where, _ in failed]] = False
    x = np.broadcast_to(pixels[0].astype(dtype), (int(keep.sum()), *how.shape)) if _looking.get() else \
        pixels[keep].astype(dtype) if failed else pixels.astype(dtype)
    resolved = settings.revised(size=list(how.size), color=how.color)
    notes = [*defaults, *(n for n in (said, _skipped(root, listing, failed) if failed else None) if n)]
    return ReadImages(keep, x, notes, resolved)


def _checked(root: Path, listing: Listing, workers: int | None, skip: bool) -> list[tuple[int, str]]:
    """Validate's check of every file (`check_all`; nothing elsewhere): the files that fail, every
    one named in one refusal without `skip`."""
    if _looking.get() != "check":
        return []
    failed = check_all(listing, workers)
    if failed and not skip:
        if len(failed) == 1:
            raise _unreadable(listing.files[failed[0][0]], failed[0][1])
        raise DataError(f"{root}: {len(failed):,} of {len(listing.files):,} image files cannot be read: "
                        f"{_listed(root, listing, failed)}. Fix or remove them (or data.image.on_error: skip)")
    return failed


def _pixels(root: Path, listing: Listing, how: Decoding, settings: ImageSettings, checked: list[tuple[int, str]]
            ) -> tuple[np.ndarray, list[tuple[int, str]], str | None]:
    """The folder's uint8 pixels (from the cache where it holds them), the files that failed, and the
    note on the cache; looking only: one image standing for every sample, black for summary (nothing
    decoded), the first that decodes for validate (`checked`: the files it found bad)."""
    skip = settings.on_error == "skip"
    if _looking.get():
        bad = {where for where, _ in checked}
        first = np.zeros(how.shape, np.uint8) if _looking.get() == "look" else \
            _first_pixels([f for i, f in enumerate(listing.files) if i not in bad] or listing.files, how, skip)
        return np.broadcast_to(first, (len(listing.files), *how.shape)), checked, None
    folder = None if is_image_file(root) or not settings.cache else \
        Path(settings.cache_dir).expanduser() if settings.cache_dir else image_cache.default_dir()
    pixels, failed, said = image_cache.decoded(
        root, listing.files, how, folder,
        lambda out, into: decode_all(listing, how, settings.workers, skip, Progress(root, len(listing.files)), out,
                                     into), _progress.get() or (lambda text: None))
    _refuse_first(listing.files, failed, skip)  # failures cached by a run that skipped them
    return pixels, failed, said


def _shown(root: Path, files: list[str]) -> list[str]:
    """The files as predict names them: relative to the folder given (one image file: as given)."""
    return [str(root)] * len(files) if root.is_file() else image_cache.relative(files, root)


def _listed(root: Path, listing: Listing, failed: list[tuple[int, str]]) -> str:
    """The files that failed, each with why (relative to the folder or table; SKIPPED_SHOWN of them)."""
    shown = "; ".join(f"{os.path.relpath(listing.files[where], root if root.is_dir() else root.parent)}: {why}"
                      for where, why in failed[:SKIPPED_SHOWN])
    return shown + (f"; ... ({len(failed) - SKIPPED_SHOWN} more)" if len(failed) > SKIPPED_SHOWN else "")


def _skipped(root: Path, listing: Listing, failed: list[tuple[int, str]]) -> str:
    """The run-log line listing the files data.image.on_error: skip left out."""
    return (f"{root}: {len(failed):,} file(s) that cannot be decoded skipped (data.image.on_error: skip): "
            f"{_listed(root, listing, failed)}")


def _notes(root: Path, listing: Listing, shape: tuple[int, ...]) -> list[str]:
    """What reading the folder decided and left out, a line each."""
    channels, height, width = shape
    color = {1: "grayscale", 3: "rgb", 4: "rgba"}[channels]
    notes = [f"{root}: {len(listing.files):,} images in {len(listing.classes)} class folders, decoded as {color} "
             f"{height}x{width} ({channels} x {height} x {width} per sample)"]
    if listing.ignored:
        shown = ", ".join(str(Path(p).relative_to(root)) for p in listing.ignored[:SHOWN])
        notes.append(f"{root}: {len(listing.ignored):,} other file(s) ignored (not {'/'.join(SUFFIXES)} images in a "
                     f"class folder): {shown}" + (", ..." if len(listing.ignored) > SHOWN else ""))
    return notes
