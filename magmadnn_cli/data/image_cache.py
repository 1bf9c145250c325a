"""A cache of decoded images: the uint8 pixels (N, C, H, W) of a folder, memory-mapped, reused by later
runs. Each (folder, decoding) has one slot in the cache folder (data.image.cache_dir, default
$XDG_CACHE_HOME/magmadnn/images): `<slot>.npy` (the pixels) and `<slot>.json` (the key: every file's
path, size, modification and status change times and inode, and the decoding; the pixels' CRC-32;
the files that failed), each written temp + fsync + rename, the JSON last. The decoders write the
pixels straight into the temp .npy (memory-mapped, its space allocated first), so they never travel
between processes. A slot whose key differs (a file added, removed or changed; other settings) or
whose pixels do not match their CRC is decoded again, never trusted.
A lock file per slot makes the processes of one node (MPI ranks, concurrent runs) decode a folder
once: the first decodes and writes, the others wait and map what it wrote.

A file that changes while it is decoded is refused, naming it (its pixels may be of either version);
once decoded, a run trains on what it read: a file changed later is seen by the next run's key."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import DataError
from ..processes import alive
from ..files import json_object, temp_beside, write_json
from .image_decode import Decoding, stamps

VERSION = 3  # 2: large JPEGs decoded at a reduced scale (image_decode._drafted); 3: stamps with ctime, inode
CRC_CHUNK = 1 << 26  # bytes checksummed at a time
Failed = list[tuple[int, str]]  # the files that failed (position, why)
# fills `out` (N, C, H, W), directly or through the .npy file named (which `out` maps); the files that
# failed, and every file's (size, time) taken after it was decoded
Decode = Callable[[np.ndarray, "str | None"], tuple[Failed, np.ndarray]]


def default_dir() -> Path:
    """$XDG_CACHE_HOME/magmadnn/images (default ~/.cache/magmadnn/images)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "magmadnn" / "images"


def cache_key(root: Path, files: list[str], stamped: np.ndarray, how: Decoding) -> str:
    """What the pixels depend on: the files (paths relative to `root`, sizes, times) and the decoding."""
    digest = hashlib.sha256(json.dumps([VERSION, asdict(how)]).encode())
    digest.update("\0".join(relative(files, root)).encode("utf-8", "surrogateescape"))
    digest.update(np.ascontiguousarray(stamped, "<i8").tobytes())
    return digest.hexdigest()


def relative(files: list[str], root: Path) -> list[str]:
    """os.path.relpath(file, root) of each file: its tail, for the files listed under `root` (their
    paths start with it), relpath for the others."""
    prefix = os.path.join(str(root), "")
    return [f[len(prefix):] if f.startswith(prefix) else os.path.relpath(f, root) for f in files]


def slot_of(folder: Path, root: Path, how: Decoding) -> Path:
    """The slot's path (without suffix) for this folder read this way."""
    name = json.dumps([os.path.abspath(root), asdict(how)])
    return folder / hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def crc(pixels: np.ndarray) -> int:
    flat, value = pixels.reshape(-1), 0
    for start in range(0, flat.size, CRC_CHUNK):
        value = zlib.crc32(flat[start:start + CRC_CHUNK], value)
    return value


@contextlib.contextmanager
def locked(slot: Path, waiting: Callable[[str], None] = lambda pid: None) -> Iterator[None]:
    """The slot's lock, held, with this process's id written in it; where another process holds it,
    `waiting` is told its id before this one waits; a lock file that cannot be opened (another
    user's) raises Unusable. The pixels' temp files this host's dead writers left are removed."""
    try:
        fd = os.open(slot.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as exc:
        raise Unusable(f"{slot.with_suffix('.lock')}: cannot open the cache's lock ({exc.strerror or exc})") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting(os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _remove_dead_writers(slot)
        yield
    finally:
        os.close(fd)  # releases the lock


class Unusable(Exception):
    """The cache cannot be used here (its lock cannot be opened): the images are decoded in memory."""


def _writer_tag() -> str:
    """What names a pixels temp file's writer: `<pid>@<host>.`"""
    return f"{os.getpid()}@{socket.gethostname()}."


def _remove_dead_writers(slot: Path) -> None:
    """Remove the slot's pixels temp files whose writer was a process of this host that is gone. A
    live one's stays, and so does another host's (on a shared folder whose locks hold per node, its
    writer may be at work)."""
    host = socket.gethostname()
    for stale in slot.parent.glob(f".{slot.name}.npy.*@*.tmp"):
        pid, _, rest = stale.name[len(slot.name) + 6:].partition("@")
        if pid.isdigit() and rest.rpartition(".")[0].rpartition(".")[0] == host and not alive(int(pid)):
            with contextlib.suppress(OSError):
                stale.unlink()


def load(slot: Path, key: str, shape: tuple[int, ...]) -> tuple[tuple[np.ndarray, Failed] | None, str]:
    """The slot's pixels (memory-mapped, read-only) and failures where its key is `key` and its pixels
    are whole; else None, and why it was not used ('' for an empty slot)."""
    meta = json_object(slot.with_suffix(".json"))
    if not meta:
        return None, ""
    if meta.get("key") != key or meta.get("version") != VERSION:
        return None, "the files or settings changed since it was written"
    try:
        pixels = np.load(slot.with_suffix(".npy"), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None, "its pixels file is missing or damaged"
    if pixels.shape != shape or pixels.dtype != np.uint8 or crc(pixels) != meta.get("crc32"):
        return None, "its pixels do not match their checksum (damaged)"
    return (pixels, [(int(w), str(why)) for w, why in meta.get("failed", [])]), ""


@contextlib.contextmanager
def new_npy(path: Path, shape: tuple[int, ...]) -> Iterator[tuple[np.ndarray, str]]:
    """A uint8 .npy of `shape` for decoders to fill, memory-mapped, and its name (other processes map
    it by name): a temp file beside `path`, its space allocated first (a full disk is said now, not a
    crash on a page later), flushed, fsynced and renamed to `path` where the block ends without error,
    removed where it raises."""
    with temp_beside(path, _writer_tag()) as (fd, tmp):
        os.close(fd)  # mapped by name, here and by the decoders
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        with open(tmp, "r+b") as f:
            if hasattr(os, "posix_fallocate"):  # Linux and most Unixes; elsewhere the pages are written as decoded
                os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        yield out, tmp
        out.flush()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())


def prune(folder: Path) -> None:
    """Remove the slots of folders that no longer exist (their pixels can never be used again)."""
    for meta_path in folder.glob("*.json"):
        meta = json_object(meta_path)
        if meta.get("version") == VERSION and isinstance(meta.get("root"), str) and not os.path.exists(meta["root"]):
            for suffix in (".npy", ".json", ".lock"):
                with contextlib.suppress(OSError):
                    meta_path.with_suffix(suffix).unlink()


def check_unchanged(files: list[str], before: np.ndarray, after: np.ndarray, failed: Failed) -> None:
    """Refuse a file whose size or time changed while the folder was decoded (`before`: the key's
    stamps; `after`: each file's, taken once decoded; one that failed, a vanished file under
    on_error: skip, is already counted)."""
    changed = (after != before).any(axis=1)
    changed[[where for where, _ in failed]] = False
    moved = np.flatnonzero(changed)
    if len(moved):
        path = Path(files[int(moved[0])])
        raise DataError(f"{path}: changed while the images were decoded ({len(moved)} file(s) in all); its pixels "
                        "may be of either version, so nothing was trained or cached. Run again once the folder is "
                        "no longer being written")


def decoded(root: Path, files: list[str], how: Decoding, folder: Path | None, decode: Decode,
            say: Callable[[str], None] = lambda text: None) -> tuple[np.ndarray, Failed, str | None]:
    """`decode`'s pixels and failures, from the cache in `folder` where it holds them for these files
    and settings (else decoded into a new slot there; `folder` None: into memory, not cached; a folder
    or lock that cannot be made or written: into memory, said); and a note on the cache. `say`: a
    line while this run waits for another decoding the same folder."""
    before, shape = stamps(files), (len(files), *how.shape)
    unusable = None if folder is None else _unusable(folder)
    if folder is not None and not unusable:
        try:
            return _through_cache(root, files, how, folder, decode, say, before)
        except Unusable as exc:  # raised before anything is decoded
            unusable = str(exc)
    pixels = np.empty(shape, np.uint8)
    failed, after = decode(pixels, None)
    check_unchanged(files, before, after, failed)
    return pixels, failed, unusable and (f"{root}: decoded in memory, not cached: {unusable}; set "
                                         "data.image.cache_dir to a writable folder (or data.image.cache: false)")


def _through_cache(root: Path, files: list[str], how: Decoding, folder: Path, decode: Decode,
                   say: Callable[[str], None], before: np.ndarray) -> tuple[np.ndarray, Failed, str]:
    """`decoded`'s pixels from the folder's slot for them, or decoded into it (`before`: the key's stamps)."""
    slot, key, shape = slot_of(folder, root, how), cache_key(root, files, before, how), (len(files), *how.shape)

    def waiting(pid: str) -> None:
        say(f"{root}: waiting for process {pid}, which is decoding the same images into the cache ({slot}.npy); "
            "this run then reads them from there")
    with locked(slot, waiting):
        hit, why = load(slot, key, shape)
        if hit is not None:
            return *hit, f"{root}: decoded images read from the cache ({slot}.npy)"
        with new_npy(slot.with_suffix(".npy"), shape) as (out, name):
            failed, after = decode(out, name)
            check_unchanged(files, before, after, failed)
            value = crc(out)
        write_json(slot.with_suffix(".json"), {"version": VERSION, "key": key, "root": os.path.abspath(root),
                                               "shape": list(shape), "crc32": value, "failed": failed})
        pixels = np.load(slot.with_suffix(".npy"), mmap_mode="r", allow_pickle=False)
    prune(folder)
    said = f" (the cached copy was not used: {why})" if why else ""
    return pixels, failed, f"{root}: decoded images cached in {slot}.npy for later runs{said}"


def _unusable(folder: Path) -> str | None:
    """Why the cache folder cannot be used (made, or written by this user), else None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{folder}: cannot create the image cache folder ({exc.strerror or exc})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder}: the image cache folder is not writable by this user"
    return None
