"""cupy.linalg in the stand-in: numpy.linalg's functions as device operations."""

from __future__ import annotations

from typing import Any

import numpy as _np


def __getattr__(name: str) -> Any:
    from . import _call

    value = getattr(_np.linalg, name)
    if not callable(value) or isinstance(value, type):
        return value
    return lambda *args, **kwargs: _call(value, args, kwargs)
