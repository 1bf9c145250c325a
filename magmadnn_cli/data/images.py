"""Image data sets in their published formats: MNIST IDX files and CIFAR-10 batches (binary `.bin`
and python pickles, the latter through an unpickler that only rebuilds numpy arrays and plain data)."""

from __future__ import annotations

import gzip
import io
import math
import os
import pickle
import zlib
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..core import backend as B
from ..errors import DataError

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct

IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
CIFAR_SHAPE = (3, 32, 32)


CHUNK = 1 << 24  # bytes inflated or read at a time


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _amount(size: int) -> str:
    return B.gib(size) if size < 2**50 else f"{float(size):.3g} bytes"


def _limit() -> int:
    """Half the memory this process may allocate: the most one file's bytes may take."""
    return (B.host_memory_available() or 2**40) // 2


def _budget(path: Path, size: int, what: str, limit: int | None = None) -> None:
    """Refuse, before allocating, `size` bytes beyond the limit (half the memory this process may allocate)."""
    limit = _limit() if limit is None else limit
    if size > limit:
        raise DataError(f"{path}: {what} {_amount(size)}, more than half the memory this process may allocate "
                        f"({B.gib(2 * limit)}); refused (a gzip bomb, or data too large for this machine)")


def _read_bytes(path: Path) -> bytearray:
    """The file's bytes, gunzipped for .gz in bounded chunks, never more than half the memory
    available when reading starts (a gzip bomb is refused while it inflates, not after)."""
    data, limit = bytearray(), _limit()
    try:
        with _open(path) as f:
            while chunk := f.read(CHUNK):
                data += chunk
                _budget(path, len(data), "holds (or inflates to) at least", limit)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    return data


def _read_payload(f: IO[bytes], path: Path, shape: tuple[int, ...], size: int, header: int) -> np.ndarray:
    """The `size` bytes the header's `shape` promises, into one array allocated once (a plain file's
    size checked first, then the budget), read or inflated in bounded chunks; a payload shorter or
    longer than promised is refused, expected vs got."""
    def refuse(held: str) -> DataError:
        return DataError(f"{path}: truncated or corrupt IDX file: header says {shape} ({size:,} bytes), the file "
                         f"{held}")
    if not path.name.endswith(".gz") and os.fstat(f.fileno()).st_size - header != size:
        raise refuse(f"holds {os.fstat(f.fileno()).st_size - header:,}")
    _budget(path, size, f"the header's shape {shape} promises")
    try:
        out = np.empty(size, dtype=np.uint8)
    except MemoryError as exc:
        raise DataError(f"{path}: the header's shape {shape} promises {_amount(size)}, which this process cannot "
                        "allocate (its memory or address-space limit); refused") from exc
    view, done = memoryview(out), 0
    while done < size and (got := f.readinto(view[done:done + CHUNK])):
        done += got
    if done < size:
        raise refuse(f"inflates to {done:,}")
    if f.read(1):
        raise refuse("holds (or inflates to) more than that")
    return out


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST format): 2 zero bytes, a type code, the number of dimensions, the sizes;
    the payload read into one array sized by the header, checked against the budget first."""
    try:
        with _open(path) as f:
            magic = f.read(4)
            if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in IDX_TYPES:
                raise DataError(f"{path}: not an IDX file (bad magic number)")
            ndim = magic[3]
            dims = f.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise DataError(f"{path}: truncated IDX header ({ndim} dimensions declared, {4 + len(dims)} bytes)")
            shape = tuple(int(v) for v in np.frombuffer(dims, dtype=">u4"))
            dtype = np.dtype(IDX_TYPES[magic[2]])
            size = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
            payload = _read_payload(f, path, shape, size, 4 + 4 * ndim)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    return payload.view(dtype).reshape(shape)


def idx_labels_path(images: Path) -> Path:
    name = images.name.replace("idx3", "idx1").replace("images", "labels")
    return images.with_name(name)


def read_mnist_idx(images: Path) -> tuple[np.ndarray, np.ndarray]:
    labels_path = idx_labels_path(images)
    if not labels_path.exists():
        raise DataError(f"{images}: the labels file {labels_path.name} is not beside it")
    x, y = read_idx(images), read_idx(labels_path)
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise DataError(f"{images}: expected images (N, H, W) and labels (N,); received {x.shape} and {y.shape}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        record = int(np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))[0])
        raise DataError(f"{images}: image {record + 1} holds a non-finite pixel value (NaN or infinity); clean the "
                        "data first")
    if y.dtype.kind == "f" and not (np.isfinite(y) & (y == np.round(y))).all():
        record = int(np.flatnonzero(~(np.isfinite(y) & (y == np.round(y))))[0])
        raise DataError(f"{labels_path}: label {record + 1} is {y[record]}; labels are whole class numbers")
    return x[:, None], y.astype(np.int64)  # pixels as stored (uint8 for MNIST): the caller casts once


def read_cifar_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32x32)."""
    files = sorted(path.glob("data_batch_*.bin")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"{path}: no data_batch_*.bin files in this folder")
    xs, ys = [], []
    for f in files:
        raw = _read_bytes(f)
        if len(raw) == 0 or len(raw) % 3073:
            raise DataError(f"{f}: not a CIFAR-10 binary batch ({len(raw)} bytes is not a multiple of 3073)")
        records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3073)
        ys.append(records[:, 0].astype(np.int64))
        xs.append(records[:, 1:].reshape((-1, *CIFAR_SHAPE)))
    return np.concatenate(xs), np.concatenate(ys)


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """What Python 3's protocol-2 pickles use to store bytes; only that one use is allowed."""
    if encoding != "latin1" or not isinstance(text, str):
        raise pickle.UnpicklingError("refused: _codecs.encode is allowed only for latin1 byte strings")
    return text.encode("latin1")


class _ArraysOnly(pickle.Unpickler):
    """Rebuilds numpy arrays and plain containers; any other class or function is refused."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return {"_reconstruct": _reconstruct, "ndarray": np.ndarray, "dtype": np.dtype,
                    "encode": _latin1_bytes}[name]
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only numpy arrays and plain data are allowed")


def read_cifar_python(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 python batches (`data_batch_1` ... or a folder of them): dicts of `data` and `labels`."""
    files = sorted(path.glob("data_batch_*")) if path.is_dir() else [path]
    files = [f for f in files if not f.name.endswith(".bin")]
    if not files:
        raise DataError(f"{path}: no data_batch_* files in this folder")
    xs, ys = [], []
    for f in files:
        try:
            batch = _ArraysOnly(io.BytesIO(_read_bytes(f)), encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
            raise DataError(f"{f}: not a CIFAR-10 python batch ({exc})") from exc
        if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
            raise DataError(f"{f}: not a CIFAR-10 python batch (expected a dict with data and labels)")
        x, y = _cifar_records(f, batch[b"data"], batch[b"labels"])
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _cifar_records(path: Path, data: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """A python batch's images (N, 3072 pixel bytes) and N integer labels, each count checked."""
    width = math.prod(CIFAR_SHAPE)
    try:
        pixels, y = np.asarray(data), np.asarray(labels)
    except ValueError as exc:  # ragged lists
        raise DataError(f"{path}: not a CIFAR-10 python batch (data or labels are not arrays: {exc})") from exc
    if pixels.dtype.kind not in "iu" or (pixels.size and (pixels.min() < 0 or pixels.max() > 255)):
        raise DataError(f"{path}: CIFAR-10 pixels are bytes (0-255); data holds {pixels.dtype} values")
    per_row = math.prod(pixels.shape[1:]) if pixels.ndim > 1 else width
    if pixels.ndim == 0 or pixels.size % width or per_row != width:
        raise DataError(f"{path}: CIFAR-10 data is {width} pixel bytes (3x32x32) per image; received shape "
                        f"{pixels.shape}, {pixels.size:,} values" + (f": {per_row} per image" if per_row != width else
                                                                      " (not a whole number of images: truncated?)"))
    pixels = pixels.reshape(-1, width)
    if y.ndim != 1 or (y.size and y.dtype.kind not in "iu"):
        raise DataError(f"{path}: CIFAR-10 labels are one integer per image; received {y.dtype} labels of shape "
                        f"{y.shape}")
    if len(y) != len(pixels):
        raise DataError(f"{path}: {len(pixels):,} images but {len(y):,} labels; a CIFAR-10 batch has one label per "
                        "image (a truncated or damaged batch)")
    return pixels.astype(np.uint8).reshape((-1, *CIFAR_SHAPE)), y.astype(np.int64)


def image_format(path: Path) -> str | None:
    """Which image reader handles `path`, or None."""
    name = path.name.lower()
    if "idx3-ubyte" in name:
        return "idx"
    if name.endswith(".bin") or (path.is_dir() and any(path.glob("data_batch_*.bin"))):
        return "cifar_bin"
    if name.startswith(("data_batch_", "test_batch")) or (path.is_dir() and any(path.glob("data_batch_*"))):
        return "cifar_python"
    return None


def read_images(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The images (N, C, H, W) as stored (uint8 for 8-bit pixels) and their labels."""
    kind = image_format(path)
    reader = {"idx": read_mnist_idx, "cifar_bin": read_cifar_bin, "cifar_python": read_cifar_python}[kind]  # type: ignore[index]
    try:
        x, y = reader(path)
    except MemoryError as exc:  # a conversion beyond what the process may allocate
        raise DataError(f"{path}: too large for the memory this process may allocate; use a smaller data set") \
            from exc
    if len(x) == 0:
        raise DataError(f"{path}: holds no images (0 records)")
    if x[0].size == 0:
        raise DataError(f"{path}: its images of shape {x.shape[1:]} hold no pixels")
    return x, y
