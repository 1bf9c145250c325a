"""Writing outputs safely: to a temporary file in the same folder, flushed and fsynced, then renamed,
so a crash or a full disk never leaves a half-written file under the final name."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Any, Callable, Collection, Iterator

import numpy as np

from . import signals
from .config.names import is_data_name
from .errors import MagmaError


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_file(out: Path, inputs: tuple[Path, ...] = (), overwrite: bool = False, given: bool = True) -> None:
    """A file output (`--output`, or the default one where not `given`) may replace an existing
    regular file only with --overwrite, and never a link, a device, a folder or one of the command's
    own inputs."""
    if out.is_symlink():
        raise MagmaError(f"--output {out}: is a symbolic link; it is not replaced (give the real path)")
    if out.exists() and not out.is_file():
        kind = "a folder" if out.is_dir() else "not a regular file (a device, pipe or socket)"
        raise MagmaError(f"--output {out}: is {kind}; give a file path")
    for source in inputs:
        try:
            same = out.exists() and source.exists() and os.path.samefile(out, source)
        except OSError:
            same = False
        if same:
            raise MagmaError(f"--output {out}: is the command's own input {source}; writing it would destroy it")
    if out.exists() and not overwrite:
        named = f"--output {out}" if given else f"{out} (the default output)"
        raise MagmaError(f"{named}: exists; it is not replaced without --overwrite (add it, or give "
                         f"{'another path' if given else 'another with --output'})")


def cannot_write(path: Path, exc: OSError) -> MagmaError:
    """The error for a file or folder that could not be written: its path, the system's reason, and
    for a full disk or quota, or a folder this user may not write, what to do."""
    if disk_full(exc):
        fix = "; free space on that disk (or write elsewhere) and run again"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "; write elsewhere, or make it writable for this user, and run again"
    else:
        fix = ""
    return MagmaError(f"{path}: cannot write: {exc.strerror or exc}{fix}")


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, is a full disk or quota (ENOSPC, EDQUOT)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def temp_beside(path: Path, tag: str = "") -> Iterator[tuple[int, str]]:
    """A new temp file beside `path` (named `.<name>.<tag><random>.tmp`), open (its descriptor, for the
    block to close) and its name (the mode a new file gets, 0666 less the umask, not mkstemp's private
    0600), for the block to write and fsync; renamed over `path` when the block ends without error,
    removed when it raises (an OSError said as `cannot_write`)."""
    tmp = None
    try:
        with signals.held():  # a stop signal waits until the temp file's name is known
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{tag}", suffix=".tmp", dir=path.parent)
            os.fchmod(fd, 0o666 & ~umask())
        yield fd, tmp
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            raise cannot_write(path, exc) from exc
        raise


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """`write(f)` into a temp file beside `path`, fsync, rename over `path` (`temp_beside`)."""
    with temp_beside(Path(path)) as (fd, _), os.fdopen(fd, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def to_json(data: Any) -> str:
    """Strict JSON (RFC 8259): NaN and infinities, which JSON has no words for, become null."""
    return json.dumps(_finite(data), indent=2, default=str, allow_nan=False)


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    if isinstance(data, np.generic):
        return _finite(data.item())
    return data


def write_json(path: Path, data: Any) -> None:
    write_text(path, to_json(data) + "\n")


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


def _npz_sizes_problem(path: Path, keys: Collection[str] | None) -> str | None:
    """Check each member's declared shape against its size before numpy allocates it: a forged
    header can declare terabytes (numpy allocates the declared array first), or a member can inflate
    far beyond the archive (a zip bomb). None when all is consistent."""
    from .core.backend import gib, host_memory_available  # files is below the backend
    limit = (host_memory_available() or 2**40) // 2
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                if keys is not None and name not in keys:
                    continue
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = read_header(member)
                    declared = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
                    if declared > info.file_size:
                        return (f"array {name!r} declares shape {shape} ({gib(declared)}) but holds "
                                f"{gib(info.file_size)}")
                total += info.file_size
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return None  # np.load reports what is wrong with the archive itself
    if total > limit:
        return f"its arrays inflate to {gib(total)}, more than half the memory available ({gib(2 * limit)})"
    return None


def _what_else(path: Path) -> str:
    """What a file that is not an .npz is, by its name: a config to train, a data file, or unknown."""
    name = path.name.lower()
    if name.endswith((".yaml", ".yml")):
        return f"a YAML config, not a model file: train it first (magmadnn train {path}), then use the run's model.npz"
    if is_data_name(path):
        return "a data file, not a model file (model.npz from magmadnn train, or its run folder)"
    return "not an .npz archive"


def load_npz(path: Path, what: str, error: type[MagmaError] = MagmaError,
             keys: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz (all, or those of `keys` it holds), never unpickling: a file that is not
    an .npz, holds Python objects or is damaged becomes one `error` naming `what`."""
    if not is_npz(path):
        raise error(f"{path}: not a readable {what} ({_what_else(Path(path))})")
    problem = _npz_sizes_problem(path, keys)
    if problem:
        raise error(f"{path}: refused: {problem}")
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files if keys is None or k in keys}
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
            raise error(f"{path}: refused: the file holds Python objects (pickles), which are never loaded") from exc
        raise error(f"{path}: corrupt {what} ({exc})") from exc
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise error(f"{path}: not a readable {what} ({type(exc).__name__}: {exc})") from exc


def file_sha256(path: Path | None) -> str | None:
    """sha256 of a regular file (None for streams, stdin and synthetic data)."""
    if path is None or not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def json_object(path: Path) -> dict[str, Any]:
    """The JSON object in a file the tool wrote (a marker, a ledger, metrics.json); {} where the file is
    missing, unreadable, or holds anything else."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
