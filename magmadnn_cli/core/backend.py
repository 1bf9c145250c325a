"""The array backend (MagmaDNN's MemoryManager): numpy on the host or cupy on a GPU, in a float type.

A `Backend` is one explicit, immutable object (array module, device, float type), chosen once per run
by `select` and made the run's with `using`: `current()` is the backend of the run in progress (numpy,
float32 outside any run). Ops are written against the array module of their inputs
(`array_module`), so the same code runs on both.
"""

from __future__ import annotations

import os
import time
import types
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import DeviceError, MagmaError

DEVICES = ("auto", "cpu", "gpu")
# The parameters' (and activations') float type of each precision; the mixed ones (Keras' names) keep
# float32 master weights and take their matmul and convolution operands in a half type (`HALVES`).
PRECISIONS = {"float32": np.float32, "float64": np.float64, "mixed_bfloat16": np.float32,
              "mixed_float16": np.float32}
HALVES = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
MEMORY = ("device", "managed")



@dataclass(frozen=True)
class Backend:
    """Where a run's arrays live and in which float type."""
    xp: types.ModuleType  # numpy or cupy
    device: str           # "cpu" or "gpu"
    floatx: type          # the default float dtype
    half: str | None = None  # mixed precision: matmul and convolution operands in "bfloat16" or "float16"

    @property
    def name(self) -> str:
        return f"{self.device} {np.dtype(self.floatx).name}" + (f" (operands {self.half})" if self.half else "")


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
    return Backend(np, "cpu", PRECISIONS[precision], HALVES.get(precision))


def _import_cupy() -> types.ModuleType | None:
    try:
        import cupy  # optional dependency
    except Exception:  # noqa: BLE001  ImportError, or a broken CUDA install raising anything at import
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
    except Exception as exc:  # noqa: BLE001  cupy raises RuntimeError subclasses (CUDARuntimeError, ...) at first use
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
        return Backend(cupy, "gpu", PRECISIONS[precision], HALVES.get(precision))
    return cpu(precision)


def nccl_module() -> Any | None:
    """cupy's NCCL binding (`cupy.cuda.nccl`), or None (cupy missing, or built without NCCL)."""
    try:
        from cupy.cuda import nccl  # optional dependency
    except Exception:  # noqa: BLE001  ImportError, or a CUDA install that fails at import
        return None
    return nccl if getattr(nccl, "available", True) else None


def use_gpu_device(index: int) -> None:
    """Bind this process to GPU `index` (data-parallel ranks pick theirs by node-local rank)."""
    xp = current().xp
    if current().device == "gpu":
        xp.cuda.Device(index % xp.cuda.runtime.getDeviceCount()).use()


def gpu_sharing(ranks_on_node: int) -> str | None:
    """The warning for a node whose ranks outnumber its visible GPUs (None: a GPU per rank)."""
    if current().device != "gpu":
        return None
    count = current().xp.cuda.runtime.getDeviceCount()
    if ranks_on_node <= count:
        return None
    return (f"this node runs {ranks_on_node} ranks but sees {count} GPU{'s' * (count != 1)}: they share them (node-local "
            f"rank r uses GPU r mod {count}) and reduce through MPI, not NCCL (one GPU per rank); start at most "
            f"{count} ranks per node (--hosts HOST:{count}), or make more GPUs visible (CUDA_VISIBLE_DEVICES)")


def array_module(a: Any) -> types.ModuleType:
    """numpy or cupy, whichever owns `a` (Chainer's get_array_module)."""
    xp = current().xp
    if isinstance(a, np.ndarray) or np.isscalar(a) or xp is np:
        return np
    return xp


def operand(a: Any) -> Any:
    """`a` as a matmul or convolution operand under the current precision: itself, or under mixed
    precision rounded to the half type (to nearest, ties to even) and held in float32, so that the
    products, exact in float32, are summed in float32 as tensor cores do. bfloat16 rounds float32's bits
    (the same on numpy and cupy, with no dtype of its own needed); NaN stays NaN."""
    half = current().half
    if half is None:
        return a
    if half == "float16":
        with np.errstate(over="ignore"):  # beyond float16's range is infinite, as on the device
            return a.astype(np.float16).astype(a.dtype)
    xp = array_module(a)
    bits = xp.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + (((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))) & np.uint32(0xFFFF0000)
    return xp.where(xp.isnan(a), a, rounded.view(np.float32))


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


def new_stream() -> Any:
    """A created (non-blocking) CUDA stream: the one a captured step runs on (the legacy default stream
    cannot be captured)."""
    return current().xp.cuda.Stream(non_blocking=True)


@contextmanager
def graph_memory() -> Iterator[list]:
    """Around a CUDA-graph capture: every block allocated during it is kept in the yielded list, so the
    memory pool never hands the graph's buffers to other work while the list (the graph's owner) lives
    (none is reused within the capture either: a graph holds all a step allocates)."""
    kept: list = []
    cuda = current().xp.cuda
    allocate = cuda.get_allocator()

    def keeping(size: int) -> Any:
        block = allocate(size)
        kept.append(block)
        return block
    with cuda.using_allocator(keeping):
        yield kept


def follow_default_stream(stream: Any) -> None:
    """Make `stream` wait (on the device) for the work queued so far on the legacy default stream."""
    stream.wait_event(current().xp.cuda.Stream.null.record())


def synchronize() -> None:
    """Wait for queued GPU work on every stream (for honest timings); a no-op on the CPU."""
    if current().device == "gpu":
        current().xp.cuda.Device().synchronize()


BUDGET_SECONDS = 0.5  # how long a budget read stays good while the process's peak memory stays put


class _BoundsRead:
    """The last read of the host's memory bounds (`_host_bounds`): when (monotonic), this process's
    peak resident memory then (-1: unknown), and the bounds. Per process, as its memory is."""

    def __init__(self) -> None:
        self.when, self.peak, self.bounds = -1.0, -1, []

    def fresh(self) -> list[tuple[int, str]]:
        """The bounds, read again after BUDGET_SECONDS or when the peak memory grew."""
        now, peak = time.monotonic(), _peak_memory()
        if not (now - self.when < BUDGET_SECONDS and peak == self.peak and peak >= 0):
            self.when, self.peak, self.bounds = now, peak, _host_bounds()
        return self.bounds


_LAST_READ = _BoundsRead()


def host_memory_available() -> int | None:
    """The memory budget: bytes this process may still allocate on the host, the least of the
    machine's available memory (MemAvailable), the headroom under its address-space limit (RLIMIT_AS,
    `ulimit -v`, `prlimit --as`) and the headroom under its cgroup's memory limit (a container's or a
    job's); a bound that cannot be read is left out (None when none can). Read again after
    BUDGET_SECONDS, or at once when this process's peak memory grew (a server asks on every request:
    the ~15 files read cost 0.25 ms each time)."""
    bounds = _read_bounds()
    return max(0, min(bounds)[0]) if bounds else None


def _read_bounds() -> list[tuple[int, str]]:
    """`_host_bounds`, read again after BUDGET_SECONDS or when this process's peak memory grew: the
    budget and the message naming what sets it come from one read."""
    return _LAST_READ.fresh()


def _peak_memory() -> int:
    """This process's peak resident memory (getrusage; -1 where unknown: nothing is reused)."""
    try:
        import resource  # POSIX only
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    except (ImportError, OSError, ValueError):
        return -1


def _host_bounds() -> list[tuple[int, str]]:
    """Each readable bound on the host memory this process may allocate, with what sets it."""
    bounds = [(_mem_available(), "the machine's free memory"), (_address_space_headroom(), "its address-space "
              "limit, ulimit -v"), (_cgroup_headroom(), "its cgroup's memory limit")]
    return [(int(bound), what) for bound, what in bounds if bound is not None]


def _mem_available() -> int | None:
    """The machine's MemAvailable (Linux), else its free pages; None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_headroom() -> int | None:
    """RLIMIT_AS's soft limit minus this process's current address space (VmSize); None when unlimited."""
    try:
        import resource  # POSIX only
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return None
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    return limit - (_status_bytes("VmSize") or 0)


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def _cgroup_headroom(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The least headroom (limit minus usage, reclaimable file cache not counted as usage) under
    the memory limits of this process's cgroup and its ancestors: cgroup v2 (`memory.max`,
    `memory.current`) or v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`); None where no
    limit is set or none can be read."""
    try:
        entries = [line.split(":", 2) for line in proc_cgroup.read_text().splitlines()]
    except (OSError, UnicodeDecodeError):
        return None
    found = []
    for entry in entries:
        if len(entry) != 3:
            continue
        hierarchy, controllers, path = entry
        if hierarchy == "0" and controllers == "":
            mounts, files = (root, root / "unified"), ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            mounts, files = (root / "memory",), ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        for mount in mounts:
            found += _cgroup_chain(mount, path, *files)
    return min(found) if found else None


def _cgroup_chain(mount: Path, path: str, limit_file: str, usage_file: str, inactive: str) -> list[int]:
    """The headrooms of the cgroup at `path` under `mount` and of each ancestor up to the mount
    (inside a container the cgroup's own folder is often the mount itself)."""
    headrooms = []
    folder = mount / path.strip("/")
    while True:
        limit = _read_int(folder / limit_file)
        if limit is not None and limit < UNLIMITED:
            usage = _read_int(folder / usage_file) or 0
            headrooms.append(limit - max(0, usage - _stat_value(folder / "memory.stat", inactive)))
        if folder == mount or mount not in folder.parents:
            return headrooms
        folder = folder.parent


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None  # missing, or v2's "max" (no limit)


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def memory_available() -> int | None:
    """Bytes the current device can still allocate: free GPU memory (plus cupy's cached blocks) or host."""
    xp = current().xp
    if current().device == "gpu":
        free, _ = xp.cuda.runtime.memGetInfo()
        return int(free) + int(xp.get_default_memory_pool().free_bytes())
    return host_memory_available()


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def require_memory(needed: int, what: str, on_host: bool = False, how: str = "") -> None:
    """Refuse up front, naming the amount (and `how` it is counted), what a request would need but
    this process cannot allocate (the budget: `host_memory_available`, or the GPU's free memory)."""
    available = host_memory_available() if on_host or current().device == "cpu" else memory_available()
    if available is not None and needed > available:
        raise MagmaError(f"{what} would need {gib(needed)} of memory{f' ({how})' if how else ''}; "
                         f"{budget_text(available, on_host)}. Make it smaller.")


def budget_text(available: int, on_host: bool = True) -> str:
    """'1.2 GiB available to this process (its address-space limit, ulimit -v)': the budget and what sets it."""
    if not on_host and current().device == "gpu":
        return f"the GPU has {gib(available)} available"
    least = min(_read_bounds(), default=None)  # the bound within 2% of the budget sets it
    binding = f" ({least[1]})" if least and abs(least[0] - available) <= available // 50 + (1 << 20) else ""
    return f"{gib(available)} available to this process{binding}"
