"""cupy.random's generator, drawing on the device (numpy's PCG64 here)."""

from __future__ import annotations

from typing import Any

import numpy as _np


class Generator:
    def __init__(self, seed: Any = None) -> None:
        self._rng = _np.random.default_rng(seed)

    def __getattr__(self, name: str) -> Any:
        from . import _call

        method = getattr(self._rng, name)
        return lambda *args, **kwargs: _call(method, args, kwargs)


def default_rng(seed: Any = None) -> Generator:
    return Generator(seed)
