"""Direct calls into the BLAS that numpy itself ships with (OpenBLAS in the PyPI wheels), for the
few fused operations numpy does not expose. Every function returns False when the symbol is not
there (another numpy build), and callers then use plain numpy."""

from __future__ import annotations

import ctypes
import glob
import os
from functools import cache
from typing import Any

import numpy as np

# (symbol prefix, symbol suffix, integer type) of the CBLAS builds numpy wheels have bundled
_FLAVOURS = (("scipy_cblas_", "64_", ctypes.c_int64), ("cblas_", "64_", ctypes.c_int64), ("cblas_", "", ctypes.c_int))


@cache
def _library() -> Any | None:
    root = os.path.dirname(np.__file__)
    for pattern in ("../numpy.libs/*openblas*.so*", ".libs/*openblas*.so*", "../numpy.libs/*openblas*.dylib"):
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


@cache
def _axpby(kind: str) -> Any | None:
    lib = _library()
    if lib is None:
        return None
    real = ctypes.c_float if kind == "s" else ctypes.c_double
    for prefix, suffix, integer in _FLAVOURS:
        fn = getattr(lib, f"{prefix}{kind}axpby{suffix}", None)
        if fn is not None:
            fn.argtypes = [integer, real, ctypes.c_void_p, integer, real, ctypes.c_void_p, integer]
            fn.restype = None
            return fn
    return None


def axpby(alpha: float, x: np.ndarray, beta: float, y: np.ndarray) -> bool:
    """y <- alpha x + beta y in one pass over memory (numpy needs three). False: not done.
    (Splitting it over Python threads was slower: they contend with OpenBLAS's own threads.)"""
    kind = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}.get(y.dtype)
    if kind is None or x.dtype != y.dtype or x.size != y.size or not (x.flags.c_contiguous and y.flags.c_contiguous):
        return False
    fn = _axpby(kind)
    if fn is None:
        return False
    fn(y.size, alpha, x.ctypes.data, 1, beta, y.ctypes.data, 1)
    return True


def can_axpby(y: Any) -> bool:
    """Whether `axpby` (or, for a GPU array, the fused cupy kernel) is there for arrays like `y`."""
    if not isinstance(y, np.ndarray):
        return True
    kind = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}.get(y.dtype)
    return kind is not None and _axpby(kind) is not None


def _openblas_function(name: str) -> Any | None:
    """OpenBLAS's `openblas_<name>` under the names numpy wheels have given it (None: not there)."""
    lib = _library()
    names = (f"scipy_openblas_{name}64_", f"openblas_{name}64_", f"openblas_{name}")
    return next((fn for n in names if (fn := getattr(lib, n, None)) is not None), None) if lib else None


def set_threads(count: int) -> bool:
    """Set the BLAS's thread count at run time (the environment variables count only before numpy
    loads it). False: not done (another numpy build)."""
    fn = _openblas_function("set_num_threads")
    get_threads.cache_clear()
    if fn is None:
        return False
    fn.argtypes, fn.restype = [ctypes.c_int], None
    fn(max(1, int(count)))
    return True


def kernel_name() -> str | None:
    """The kernel set the BLAS loaded for this CPU (OpenBLAS's core name; None: not known)."""
    fn = _openblas_function("get_corename")
    if fn is None:
        return None
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    return fn().decode(errors="replace")


@cache
def get_threads() -> int | None:
    """The BLAS's thread count (None: not known, another numpy build); kept, as asking OpenBLAS costs
    a threaded GEMM's worth of microseconds, until `set_threads` changes it."""
    fn = _openblas_function("get_num_threads")
    if fn is None:
        return None
    fn.argtypes, fn.restype = [], ctypes.c_int
    return int(fn())
