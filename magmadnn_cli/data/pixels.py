"""Pixels right by default: 8-bit images scaled to [0, 1] unless data.scale says otherwise, float
images of 0-255 values warned about, channels-last arrays transposed (never reshaped), and a
data.shape that would reorder pixels refused with the transpose named."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DataError

EIGHT_BIT = 1 / 255          # the scale 8-bit pixels get when data.scale is not set: 0-255 -> 0-1
CHANNELS = (1, 3, 4)         # grayscale, RGB, RGBA
LOOKED_AT = 256              # images whose values the 0-255 warning looks at


def channels_first(x: np.ndarray, source: Any) -> tuple[np.ndarray, str | None]:
    """An (N, H, W, C) array with C in 1, 3, 4 (and H not: (N, 3, 32, 3) stays as written) as
    (N, C, H, W), the layout the convolutions take, and the note saying so; other arrays as they are."""
    if x.ndim != 4 or x.shape[3] not in CHANNELS or x.shape[1] in CHANNELS:
        return x, None
    out = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return out, (f"{source}: x holds channels-last images {tuple(x.shape)} (N, H, W, C): transposed to channels-first "
                 f"{tuple(out.shape[1:])} (C, H, W) per sample, the layout the convolutions take (pixels kept in "
                 "place, not reshaped)")


def settle_eight_bit(settled: dict[str, Any], dtype: np.dtype, ndim: int, data: Any) -> None:
    """For 8-bit pixels read as images (samples of 2 or more axes, or a data.shape of them) with no
    data.scale: data.scale settled to 1/255 (saved with the model, so predict scales alike)."""
    shape = getattr(data, "shape", None)
    images = ndim > 2 or bool(shape and len(shape) > 1)
    if np.dtype(dtype) == np.uint8 and images and getattr(data, "scale", None) is None:
        settled["scale"] = EIGHT_BIT


def eight_bit_note(settled: dict[str, Any], scale: float | None, source: str) -> str | None:
    """The line saying that 8-bit pixels were scaled by default (None where data.scale was given)."""
    if scale is not None or settled.get("scale") != EIGHT_BIT:
        return None
    return (f"{source}: 8-bit pixels (0-255) scaled to [0, 1] (data.scale: 1/255, saved with the model); set "
            "data.scale to scale them otherwise (data.scale: 1 keeps 0-255)")


def unscaled_note(x: np.ndarray, scale: float | None, method: str, source: str) -> str | None:
    """The warning for images (samples of 2 or more axes) of whole numbers up to 255, used unscaled:
    data.scale unset and nothing normalizing them (a few hundred images looked at)."""
    if x.ndim <= 2 or scale is not None or method != "none" or not len(x):
        return None
    part = x[:LOOKED_AT]
    low, high = float(part.min()), float(part.max())
    if low < 0 or high <= 1 or high > 255 or not np.array_equal(part, np.round(part)):
        return None
    return (f"{source}: the images' pixels are whole numbers from {low:g} to {high:g}, used unscaled (data.normalize: "
            "auto leaves images as read): networks train slower and worse on 0-255 inputs. Set data.scale: "
            "0.00392156862745098 (1/255, for 8-bit pixels; or 1 / the largest value), or data.normalize: standard")


def check_shape(held: tuple[int, ...], shape: list[int], source: str) -> None:
    """Refuse a data.shape that is a reordering of samples stored with several axes: a reshape there
    scrambles pixels (a transpose was meant); the transpose is named."""
    if len(held) < 2 or tuple(shape) == tuple(held) or sorted(held) != sorted(shape):
        return
    axes = _axes(held, shape)
    if axes == tuple(range(len(held))):  # equal sizes in another order: the same shape
        return
    moved = ", ".join(str(a + 1) for a in axes)
    raise DataError(f"{source}: data.shape {list(shape)} would reorder the pixels of samples stored as {tuple(held)}: "
                    f"a reshape is not a transpose (the transpose {axes} turns {tuple(held)} into {tuple(shape)}). "
                    f"Leave data.shape out to read them as stored ({tuple(held)}: channels first, as the convolutions "
                    f"take them), or save x transposed (numpy: x.transpose(0, {moved}))")


def _axes(held: tuple[int, ...], shape: list[int]) -> tuple[int, ...]:
    """For each axis of `shape`, the axis of `held` it comes from (equal sizes taken in order)."""
    free = list(range(len(held)))
    out = []
    for size in shape:
        axis = next(a for a in free if held[a] == size)
        free.remove(axis)
        out.append(axis)
    return tuple(out)
