"""Image data sets in their published formats: MNIST IDX files and CIFAR-10 batches (binary `.bin`
and python pickles, the latter through an unpickler that only rebuilds numpy arrays and plain data)."""

from __future__ import annotations

import gzip
import math
import io
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..core import backend as B
from ..errors import DataError

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct

IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
CIFAR_SHAPE = (3, 32, 32)


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped for .gz, never more than half the memory available (a gzip bomb
    is refused while it inflates, not after)."""
    limit = (B.host_memory_available() or 2**40) // 2
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as f:
            raw = f.read(limit + 1)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    if len(raw) > limit:
        raise DataError(f"{path}: holds (or inflates to) more than {B.gib(limit)}, half the memory available; "
                        "refused (a gzip bomb, or data too large for this machine)")
    return raw


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST format): 2 zero bytes, a type code, the number of dimensions, the sizes."""
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({ndim} dimensions declared, {len(raw)} bytes)")
    shape = tuple(int(v) for v in np.frombuffer(raw[4:header], dtype=">u4"))
    dtype = np.dtype(IDX_TYPES[raw[2]])
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if len(raw) - header != expected:
        raise DataError(f"{path}: truncated or corrupt IDX file: header says {shape} ({expected} bytes), "
                        f"the file holds {len(raw) - header}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


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
    return x[:, None].astype(np.float32), y.astype(np.int64)


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
        xs.append(records[:, 1:].reshape((-1, *CIFAR_SHAPE)).astype(np.float32))
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
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        xs.append(data.reshape((-1, *CIFAR_SHAPE)).astype(np.float32))
        ys.append(np.asarray(batch[b"labels"], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


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
    kind = image_format(path)
    reader = {"idx": read_mnist_idx, "cifar_bin": read_cifar_bin, "cifar_python": read_cifar_python}[kind]  # type: ignore[index]
    return reader(path)
