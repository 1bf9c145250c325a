"""Writing outputs safely: to a temporary file in the same folder, flushed and fsynced, then renamed,
so a crash or a full disk never leaves a half-written file under the final name."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

from .errors import MagmaError


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise MagmaError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise MagmaError(f"{path}: cannot write: {exc.strerror or exc}") from exc
        raise


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def is_npz(path: Path) -> bool:
    """An .npz is a zip archive; anything else must not reach np.load (which would call it a pickle).
    A file that cannot be read at all is reported as such."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except IsADirectoryError:
        return False
    except OSError as exc:
        raise MagmaError(f"{path}: cannot read: {exc.strerror or exc}") from exc
