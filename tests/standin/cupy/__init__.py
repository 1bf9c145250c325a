"""A device stand-in for cupy: the part of cupy's API the package uses, backed by numpy memory, for
proving the GPU path's structure on any CPU (never its speed).

Arrays are `ndarray` objects that wrap numpy memory but are not numpy arrays, so everything that would
cross the host boundary on a real GPU goes through a door the stand-in watches. `LEDGER` counts, per call
site in the package (`file.py:line`): device-to-host reads (`float`, `int`, `bool`, `item`, `tolist`,
`get`, `asnumpy`, boolean-mask indexing, which needs the mask's count on the host), host-to-device copies
(`asarray` of host data, indexing with host arrays), device operations and new buffers. In strict mode
(the default) it raises where cupy raises: an implicit conversion to numpy (`__array__`), a numpy function
called on a device array, a host array as an operand. Streams and CUDA-graph capture are modelled in
`cuda`: capture on the legacy default stream raises, a read or a copy during capture raises, captured
work does not change memory that existed before the capture, and a captured graph replays the recorded
operations on the same buffers (host scalars stay frozen, as in a real graph).
"""

from __future__ import annotations

import numbers
import sys
from typing import Any, Callable

import numpy as _np

from ._ledger import LEDGER, Ledger, site  # noqa: F401  (re-exported for tests)
from . import cuda
from . import fft, linalg, random  # noqa: F401

__version__ = "14.0.0-standin"
STANDIN = True


class ndarray:
    """A device array: numpy memory behind cupy's interface (not a numpy subclass)."""
    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape: Any = None, dtype: Any = float, *, _wrap: _np.ndarray | None = None) -> None:
        self._a = _wrap if _wrap is not None else _np.empty(shape, dtype)

    # -- what stays on the device --------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    data = property(lambda self: _Pointer(self._a.ctypes.data))
    T = property(lambda self: _call(_np.transpose, (self,), {}))
    base = property(lambda self: None)

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"standin.ndarray(shape={self.shape}, dtype={self.dtype})"

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # -- the host boundary ---------------------------------------------------------------------
    def __array__(self, *args: Any, **kwargs: Any) -> _np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
                        "NumPy array explicitly.")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        LEDGER.violation(f"numpy.{ufunc.__name__} called on a device array")
        return NotImplemented

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        LEDGER.violation(f"numpy.{func.__name__} called on a device array")
        return NotImplemented

    def get(self, stream: Any = None, out: Any = None, order: str = "C", blocking: bool = True) -> _np.ndarray:
        LEDGER.read("get")
        return self._a.copy()

    def item(self) -> Any:
        LEDGER.read("item")
        return self._a.item()

    def tolist(self) -> Any:
        LEDGER.read("tolist")
        return self._a.tolist()

    def __float__(self) -> float:
        LEDGER.read("float")
        return float(self._a)

    def __int__(self) -> int:
        LEDGER.read("int")
        return int(self._a)

    def __index__(self) -> int:
        LEDGER.read("int")
        return self._a.__index__()

    def __bool__(self) -> bool:
        LEDGER.read("bool")
        return bool(self._a)

    def __complex__(self) -> complex:
        LEDGER.read("complex")
        return complex(self._a)

    def set(self, arr: Any, stream: Any = None) -> None:
        LEDGER.copy("set")
        self._a[...] = arr

    # -- indexing ------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> "ndarray":
        return _call(_np.ndarray.__getitem__, (self, _index(key)), {})

    def __setitem__(self, key: Any, value: Any) -> None:
        _call(_np.ndarray.__setitem__, (self, _index(key), _operand(value)), {})

    # -- methods forward to numpy, wrapped -----------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        method = getattr(_np.ndarray, name, None)
        if method is None or name.startswith("_") or name in _HOST_METHODS:
            raise AttributeError(f"'standin.ndarray' object has no attribute {name!r}")
        return lambda *args, **kwargs: _call(method, (self, *args), kwargs)

    def __setstate__(self, state: Any) -> None:
        raise TypeError("device arrays cannot be unpickled here")


_HOST_METHODS = {"tofile", "tobytes", "dump", "dumps", "__array__"}


class _Pointer:
    """`a.data`: a device pointer (here the numpy buffer's address)."""
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _index(key: Any) -> Any:
    """An index for numpy: device index arrays unwrapped (a boolean mask needs its count on the host:
    a read, as in cupy); host index arrays are copied to the device."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    if isinstance(key, ndarray):
        if key.dtype == bool:
            LEDGER.read("boolean mask")
        return key
    if isinstance(key, _np.ndarray) or (isinstance(key, list) and key and not isinstance(key[0], slice)):
        LEDGER.copy("host index")
        return wrap(_np.asarray(key))
    return key


def _operand(value: Any) -> Any:
    if isinstance(value, _np.ndarray):  # 0-d ones too: cupy takes numpy scalars, never numpy arrays
        LEDGER.violation("a host (numpy) array used as an operand of a device operation; copy it with "
                         "cupy.asarray first")
        LEDGER.copy("implicit")
        return wrap(value)
    return value


def wrap(value: Any) -> Any:
    """numpy results as device arrays (scalars too: cupy reductions return 0-d arrays)."""
    if isinstance(value, _np.ndarray):
        return ndarray(_wrap=value)
    if isinstance(value, _np.generic):
        return ndarray(_wrap=_np.asarray(value))
    if isinstance(value, tuple):
        return tuple(wrap(v) for v in value)
    if isinstance(value, list):
        return [wrap(v) for v in value]
    return value


def unwrap(value: Any) -> Any:
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, (tuple, list)):
        return type(value)(unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    return value


def _check_operands(args: Any, kwargs: dict) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, _np.ndarray):
            _operand(value)
        elif isinstance(value, (tuple, list)):
            _check_operands(value, {})


def _call(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Run one device operation: counted, recorded when a stream is capturing, results wrapped."""
    _check_operands(args, kwargs)
    cuda.before(args, kwargs)
    raw_args, raw_kwargs = unwrap(args), unwrap(kwargs)
    result = fn(*raw_args, **raw_kwargs)
    wrapped = wrap(result)
    LEDGER.operation(_new_bytes(result, raw_args, raw_kwargs))
    cuda.record(fn, args, kwargs, wrapped)
    return wrapped


def _new_bytes(result: Any, args: tuple, kwargs: dict) -> int:
    """Bytes of the buffers an operation allocated (results that share no memory with an input)."""
    results = result if isinstance(result, tuple) else (result,)
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, _np.ndarray)]
    total = 0
    for r in results:
        if isinstance(r, _np.ndarray) and not any(_np.shares_memory(r, a) for a in inputs):
            total += r.nbytes
    return total


def _binary(name: str) -> Callable:
    op = getattr(_np.ndarray, name)

    def method(self: ndarray, other: Any) -> Any:
        if isinstance(other, _np.ndarray):
            other = _operand(other)
        elif not isinstance(other, (ndarray, numbers.Number, _np.generic, _np.ndarray)):
            return NotImplemented
        result = _call(op, (self, other), {})
        return self if name.startswith("__i") else result
    method.__name__ = name
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
              "rshift"):
    for _form in (f"__{_name}__", f"__r{_name}__", f"__i{_name}__"):
        if hasattr(_np.ndarray, _form):
            setattr(ndarray, _form, _binary(_form))
for _form in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
    setattr(ndarray, _form, _binary(_form))
for _form in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(ndarray, _form, (lambda op: lambda self: _call(op, (self,), {}))(getattr(_np.ndarray, _form)))
ndarray.__hash__ = None  # type: ignore[assignment]


# -- module functions ----------------------------------------------------------------------------
def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """Host data is copied to the device (counted); a device array is returned as is, or converted."""
    if isinstance(a, ndarray):
        return a if dtype is None or _np.dtype(dtype) == a.dtype else _call(_np.asarray, (a, dtype), {})
    LEDGER.copy("asarray")
    return ndarray(_wrap=_np.array(a, dtype=dtype, copy=True))


def array(a: Any, dtype: Any = None, copy: bool = True, order: str = "K", ndmin: int = 0) -> ndarray:
    if isinstance(a, ndarray):
        return _call(_np.array, (a,), {"dtype": dtype, "copy": copy, "order": order, "ndmin": ndmin})
    LEDGER.copy("array")
    return ndarray(_wrap=_np.array(a, dtype=dtype, copy=True, order=order, ndmin=ndmin))


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> _np.ndarray:
    if isinstance(a, ndarray):
        LEDGER.read("asnumpy")
        return a._a.copy()
    return _np.asarray(a)


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    return _call(_np.ascontiguousarray, (asarray(a),), {"dtype": dtype})


def get_array_module(*args: Any) -> Any:
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


def get_default_memory_pool() -> "cuda.MemoryPool":
    return cuda.DEFAULT_POOL


def get_default_pinned_memory_pool() -> "cuda.MemoryPool":
    return cuda.DEFAULT_POOL


def ElementwiseKernel(in_params: str, out_params: str, operation: str, name: str, **kwargs: Any) -> Callable:
    """A custom kernel runs its numpy reference, declared beside its CUDA source in the package."""
    from magmadnn_cli.core.graph import kernels

    reference = kernels.reference(name)
    outputs = [p.split()[-1] for p in out_params.split(",")]
    inputs = [p.split()[-1] for p in in_params.split(",")]

    kinds = [p.split()[0] for p in (*in_params.split(","), *out_params.split(","))]

    def launch(*args: Any) -> Any:
        _check_kernel_types(name, kinds, args)
        given_outputs = list(args[len(inputs):])
        ins = list(args[:len(inputs)])
        if not given_outputs:
            shape = _np.broadcast_shapes(*(_np.shape(a._a) if isinstance(a, ndarray) else () for a in ins))
            dtype = next(a.dtype for a in ins if isinstance(a, ndarray))
            given_outputs = [ndarray(_wrap=_np.empty(shape, dtype)) for _ in outputs]
            LEDGER.operation(sum(o.nbytes for o in given_outputs))
        _call(reference, (*ins, *given_outputs), {})
        return given_outputs[0] if len(given_outputs) == 1 else tuple(given_outputs)
    return launch


def _check_kernel_types(name: str, kinds: list[str], args: tuple) -> None:
    """cupy's rules: the arrays given for a type placeholder (T) share one dtype; a parameter of a fixed
    type (bool) takes arrays of that dtype; scalars are cast."""
    placeholders: dict[str, set] = {}
    for kind, arg in zip(kinds, args):
        if not isinstance(arg, ndarray):
            continue
        if kind in ("bool", "float32", "float64", "int32", "int64", "uint64"):
            if arg.dtype != _np.dtype(kind):
                raise TypeError(f"{name}: Type is mismatched: a {arg.dtype} array for a {kind} parameter")
        else:
            placeholders.setdefault(kind, set()).add(arg.dtype)
    for kind, found in placeholders.items():
        if len(found) > 1:
            raise TypeError(f"{name}: Type is mismatched: {kind} given {sorted(map(str, found))}")


def fuse(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("cupy.fuse is not modelled by the stand-in")


_PASS_THROUGH = (type, _np.dtype)
_HOST_ONLY = {"load", "save", "savez", "fromfile", "frombuffer", "loadtxt", "genfromtxt"}


def __getattr__(name: str) -> Any:
    """Every other numpy name: types and constants as they are (cupy shares numpy's dtypes), functions
    as device operations."""
    if name.startswith("__") or name in _HOST_ONLY:
        raise AttributeError(name)
    value = getattr(_np, name)
    if isinstance(value, _PASS_THROUGH) or not callable(value):
        return value
    wrapped = (lambda fn: lambda *args, **kwargs: _call(fn, args, kwargs))(value)
    globals()[name] = wrapped
    return wrapped
