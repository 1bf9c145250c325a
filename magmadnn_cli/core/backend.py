"""The array backend (MagmaDNN's MemoryManager): numpy on the host or cupy on a GPU, in a float type.

A `Backend` is one explicit, immutable object (array module, device, float type), chosen once per run
by `select` and made the run's with `using`: `current()` is the backend of the run in progress (numpy,
float32 outside any run). Ops are written against the array module of their inputs
(`array_module`), so the same code runs on both.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..errors import DeviceError, MagmaError

DEVICES = ("auto", "cpu", "gpu")
PRECISIONS = {"float32": np.float32, "float64": np.float64}
MEMORY = ("device", "managed")



@dataclass(frozen=True)
class Backend:
    """Where a run's arrays live and in which float type."""
    xp: types.ModuleType  # numpy or cupy
    device: str           # "cpu" or "gpu"
    floatx: type          # the default float dtype

    @property
    def name(self) -> str:
        return f"{self.device} {np.dtype(self.floatx).name}"


CPU = Backend(np, "cpu", np.float32)
_RUN: ContextVar[Backend] = ContextVar("magmadnn_backend", default=CPU)


def current() -> Backend:
    """The backend of the run in progress (`using`), numpy float32 outside any."""
    return _RUN.get()


@contextmanager
def using(backend: Backend) -> Iterator[Backend]:
    """Make `backend` the current one for the duration of a run (restored afterwards)."""
    token = _RUN.set(backend)
    try:
        yield backend
    finally:
        _RUN.reset(token)


def cpu(precision: str = "float32") -> Backend:
    return Backend(np, "cpu", PRECISIONS[precision])


def _import_cupy() -> types.ModuleType | None:
    try:
        import cupy  # noqa: PLC0415 (optional dependency)
    except Exception:  # ImportError, or a broken CUDA install raising anything at import
        return None
    return cupy


def probe_gpu() -> tuple[bool, str]:
    """Whether cupy can really compute here: importable, a device present, a kernel and a matmul run."""
    cupy = _import_cupy()
    if cupy is None:
        return False, "cupy is not installed (pip install 'magmadnn-cli[gpu]')"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            return False, "cupy found no CUDA device"
        a = cupy.arange(16, dtype=cupy.float32).reshape(4, 4)
        b = (a * 2.0 + 1.0) @ a  # an elementwise kernel and a cuBLAS matmul
        expected = (np.arange(16, dtype=np.float32).reshape(4, 4) * 2 + 1) @ np.arange(16, dtype=np.float32).reshape(4, 4)
        if not np.allclose(cupy.asnumpy(b), expected):
            return False, "the GPU smoke test computed a wrong result"
    except Exception as exc:  # cupy raises RuntimeError subclasses (CUDARuntimeError, ...) at first use
        return False, f"the CUDA runtime failed: {type(exc).__name__}: {exc}"
    return True, f"{count} CUDA device(s)"


def select(device_name: str = "auto", precision: str = "float32", memory: str = "device") -> Backend:
    """The backend a run asks for (`auto` falls back to numpy quietly); `using` makes it current."""
    if device_name not in DEVICES:
        raise DeviceError(f"unknown device {device_name!r} (expected one of {', '.join(DEVICES)})")
    if precision not in PRECISIONS:
        raise DeviceError(f"unknown precision {precision!r} (expected one of {', '.join(PRECISIONS)})")
    if memory not in MEMORY:
        raise DeviceError(f"unknown memory placement {memory!r} (expected one of {', '.join(MEMORY)})")
    use_gpu = False
    if device_name != "cpu":
        ok, reason = probe_gpu()
        if device_name == "gpu" and not ok:
            raise DeviceError(f"device: gpu was requested but no usable GPU was found: {reason}. "
                              "Use device: auto or cpu to train on the CPU.")
        use_gpu = ok
    if use_gpu:
        cupy = _import_cupy()
        assert cupy is not None
        if memory == "managed":
            cupy.cuda.set_allocator(cupy.cuda.MemoryPool(cupy.cuda.malloc_managed).malloc)
        return Backend(cupy, "gpu", PRECISIONS[precision])
    return cpu(precision)


def nccl_module() -> Any | None:
    """cupy's NCCL binding (`cupy.cuda.nccl`), or None (cupy missing, or built without NCCL)."""
    try:
        from cupy.cuda import nccl  # noqa: PLC0415 (optional dependency)
    except Exception:  # ImportError, or a CUDA install that fails at import
        return None
    return nccl if getattr(nccl, "available", True) else None


def use_gpu_device(index: int) -> None:
    """Bind this process to GPU `index` (data-parallel ranks pick theirs by node-local rank)."""
    xp = current().xp
    if current().device == "gpu":
        xp.cuda.Device(index % xp.cuda.runtime.getDeviceCount()).use()


def array_module(a: Any) -> types.ModuleType:
    """numpy or cupy, whichever owns `a` (Chainer's get_array_module)."""
    xp = current().xp
    if isinstance(a, np.ndarray) or np.isscalar(a) or xp is np:
        return np
    return xp


def to_device(a: Any, dtype: Any = None) -> Any:
    """Copy host data to the current device (no copy when already there with the right dtype)."""
    return current().xp.asarray(a, dtype=dtype)


def to_host(a: Any) -> np.ndarray:
    """A numpy array on the host."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):
        return a.get()
    return np.asarray(a)


def rng(seed: int) -> Any:
    """A seeded random generator on the current device."""
    return current().xp.random.default_rng(seed)


def synchronize() -> None:
    """Wait for queued GPU work (for honest timings); a no-op on the CPU."""
    if current().device == "gpu":
        current().xp.cuda.Stream.null.synchronize()


def host_memory_available() -> int | None:
    """Bytes of host memory available for new allocations (Linux MemAvailable; None if unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os  # noqa: PLC0415
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_available() -> int | None:
    """Bytes the current device can still allocate: free GPU memory (plus cupy's cached blocks) or host."""
    xp = current().xp
    if current().device == "gpu":
        free, _ = xp.cuda.runtime.memGetInfo()
        return int(free) + int(xp.get_default_memory_pool().free_bytes())
    return host_memory_available()


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def require_memory(needed: int, what: str, on_host: bool = False) -> None:
    """Refuse up front, naming the amount, what a request would need but the machine lacks."""
    available = host_memory_available() if on_host else memory_available()
    if available is not None and needed > available:
        where = "host" if on_host or current().device == "cpu" else "GPU"
        raise MagmaError(f"{what} would need {gib(needed)} of memory; the {where} has {gib(available)} "
                         "available. Make it smaller.")
