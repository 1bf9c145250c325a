"""`data.scale` checked against the data and the float type before it multiplies them: a factor or a
product beyond the largest number the type holds is one message naming data.scale, not numpy's
overflow warnings and a loss that becomes NaN."""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import DataError


def check_scale(x: np.ndarray, scale: float | None, dtype: np.dtype, names: list[str], source: str) -> None:
    """Refuse a data.scale that overflows `dtype` by itself or times the largest value of a column."""
    if scale is None or scale == 1.0:
        return
    largest = float(np.finfo(dtype).max)
    fix = "give a smaller data.scale (it multiplies every feature value, e.g. 0.00392 = 1/255 for pixels)"
    if scale > largest:
        raise DataError(f"data.scale: {scale:g} is beyond the largest {dtype.name} number ({largest:.3g}); {fix}")
    flat = x.reshape(len(x), -1)
    if not flat.size:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-missing column
        peaks = np.nanmax(np.abs(flat), axis=0).astype(np.float64)
    over = np.flatnonzero(np.nan_to_num(peaks, nan=0.0) > largest / scale)
    if len(over):
        j = int(over[np.argmax(peaks[over])])
        column = f"column {names[j]!r}" if j < len(names) else "the data"
        raise DataError(f"{source}: data.scale: {scale:g} times {column}'s values (they reach {peaks[j]:.6g}) is beyond "
                        f"the largest {dtype.name} number ({largest:.3g}), {len(over)} column(s) in all; {fix}")
