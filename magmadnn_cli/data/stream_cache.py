"""Encoded blocks kept for later passes (issue 48, the streamed epoch's speed): parsing and encoding
a block costs about 6 us a row (a 64 MiB CSV block 2 s on a loaded core), ten times the steps it
feeds, so an epoch that parses its file again runs at a fraction of the in-memory path's rows/s.
The fitting pass encodes every block anyway; it writes each block's encoded features and targets to
an unlinked temporary file (in TMPDIR: nothing is left behind, whatever ends the process), and each
later pass reads them back (one `preadv` a block, from the page cache or the disk). The page cache
is the kernel's: it counts against neither the process's memory nor `ulimit -v`.

No cache where the temporary folder is memory (tmpfs: the cache would hold the file in RAM) or has
less than twice the cache's size free; the file is parsed each pass then, as before."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

MEMORY_FILE_SYSTEMS = ("tmpfs", "ramfs")


@dataclass(frozen=True)
class _Entry:
    """Where a block's arrays lie in the file: x then y, each C-ordered."""
    offset: int
    x: tuple[tuple[int, ...], str]  # shape, dtype
    y: tuple[tuple[int, ...], str]


class EncodedBlocks:
    """Encoded (features, targets) by key (a block and a split), written once (`put`) and read back
    by any thread (`get`: None for a key never written). Pickled for a node's other ranks, it opens the same
    file through /proc on the same host; elsewhere it is empty."""

    def __init__(self, folder: str | None = None) -> None:
        self.file: Any = tempfile.TemporaryFile(prefix="magmadnn-stream-", dir=folder)  # unlinked at once
        self.fd, self.size = self.file.fileno(), 0
        self.entries: dict[Hashable, _Entry] = {}

    def put(self, key: Hashable, x: np.ndarray, y: np.ndarray) -> None:
        """Keep (x, y) under `key`; where the disk fills (other processes, a node's other ranks), the
        cache is dropped and later passes parse the file."""
        if self.fd is None:
            return
        entry = _Entry(self.size, (x.shape, x.dtype.str), (y.shape, y.dtype.str))
        try:
            for array in (x, y):
                self.size += _write_at(self.fd, np.ascontiguousarray(array), self.size)
        except OSError:
            self.drop()
            return
        self.entries[key] = entry

    def drop(self) -> None:
        """Forget every entry and free the file's space."""
        if self.file is not None:
            self.file.close()
        self.file, self.fd, self.entries = None, None, {}

    def get(self, key: Hashable) -> tuple[np.ndarray, np.ndarray] | None:
        entry = self.entries.get(key) if self.fd is not None else None
        if entry is None:
            return None
        x = np.empty(*entry.x)
        y = np.empty(*entry.y)
        _read_at(self.fd, x, entry.offset)
        _read_at(self.fd, y, entry.offset + x.nbytes)
        return x, y

    def will_need(self, key: Hashable) -> None:
        """Ask the kernel to read `key`'s bytes into the page cache in the background (no wait): where the
        cache file outgrew the page cache (a 10 GB table's), the next block's read then overlaps the steps."""
        entry = self.entries.get(key) if self.fd is not None else None
        if entry is not None and hasattr(os, "posix_fadvise"):
            size = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in (entry.x, entry.y))
            os.posix_fadvise(self.fd, entry.offset, size, os.POSIX_FADV_WILLNEED)

    def __getstate__(self) -> dict[str, Any]:
        path = f"/proc/{os.getpid()}/fd/{self.fd}" if self.fd is not None else None
        return {"host": socket.gethostname(), "path": path, "entries": self.entries if path else {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.entries, self.size, self.file, self.fd = {}, 0, None, None
        if state["path"] and state["host"] == socket.gethostname():
            self.entries = state["entries"]
            try:
                self.file = open(state["path"], "rb")  # the writer's unlinked file, while it lives
                self.fd = self.file.fileno()
            except OSError:
                self.entries = {}  # (unreadable here: its blocks are parsed, and read ahead, as uncached)


class JoinedBlocks:
    """Several caches read as one (the ranks' caches of the blocks each encoded): `get` and `entries` as
    `EncodedBlocks`', from whichever holds the key."""

    def __init__(self, parts: list[EncodedBlocks]) -> None:
        self.parts = parts
        self.entries: dict[Hashable, int] = {key: i for i, part in enumerate(parts) for key in part.entries}

    def get(self, key: Hashable) -> tuple[np.ndarray, np.ndarray] | None:
        at = self.entries.get(key)
        return self.parts[at].get(key) if at is not None else None

    def will_need(self, key: Hashable) -> None:
        at = self.entries.get(key)
        if at is not None:
            self.parts[at].will_need(key)


def _write_at(fd: int, array: np.ndarray, offset: int) -> int:
    """Write the array's bytes at `offset` (in pieces where the kernel writes part); their count."""
    if not array.nbytes:
        return 0
    view, done = memoryview(array).cast("B"), 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return done


def _read_at(fd: int, array: np.ndarray, offset: int) -> None:
    """Fill the array from the file's bytes at `offset`."""
    if not array.nbytes:
        return
    view, done = memoryview(array).cast("B"), 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise OSError(f"the streamed run's cache of encoded rows ended early (byte {offset + done})")
        done += got


def file_system(folder: str) -> str:
    """The type of the file system holding `folder` (the longest mount point above it in
    /proc/mounts; "" where that cannot be read)."""
    path, best, kind = os.path.realpath(folder), "", ""
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                point = fields[1].replace("\\040", " ") if len(fields) > 2 else ""
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return ""
    return kind


def room_for(nbytes: int, folder: str | None = None) -> bool:
    """Whether a cache of `nbytes` belongs in the temporary folder: on disk, with twice that free."""
    folder = folder or tempfile.gettempdir()
    return file_system(folder) not in MEMORY_FILE_SYSTEMS and 2 * nbytes <= shutil.disk_usage(folder).free


def encoded_blocks(nbytes: int) -> EncodedBlocks | None:
    """A cache for `nbytes` of encoded rows, where there is room for one (`room_for`) and the
    temporary folder takes a file."""
    try:
        return EncodedBlocks() if room_for(nbytes) else None
    except OSError:
        return None
