"""cupy.fft in the stand-in: numpy.fft's functions as device operations."""

from __future__ import annotations

from typing import Any

import numpy as _np


def __getattr__(name: str) -> Any:
    from . import _call

    value = getattr(_np.fft, name)
    if not callable(value) or isinstance(value, type):
        return value
    return lambda *args, **kwargs: _call(value, args, kwargs)
