"""Light image augmentation for NCHW training batches: random crops of a zero-padded image and
horizontal flips, vectorized over the batch (no per-sample loop). A row's draws come from a
counter-based generator keyed by (epoch key, the row's position in the epoch's global order), so
they do not depend on the rank count or on a resume."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import backend as B
from ..core.counter_random import bits64, derive_key

Array = Any
STREAM = 0  # the augmentation's stream under the epoch key (random layers take 1, 2, ...)


def draws(positions: Array, key: int, crop_padding: int) -> tuple[Array, Array, Array]:
    """Per row: vertical and horizontal crop offsets in [0, 2 * crop_padding] and a flip bit, drawn
    where `positions` live (on the device for device positions: nothing crosses to or from the host)."""
    xp = B.array_module(positions)
    bits = bits64(derive_key(key, STREAM), positions, 1, xp)[:, 0]
    span = np.uint64(2 * crop_padding + 1)
    dy = (bits & np.uint64(0xFFFF)) % span
    dx = ((bits >> np.uint64(16)) & np.uint64(0xFFFF)) % span
    flip = ((bits >> np.uint64(63)) & np.uint64(1)).astype(bool)
    return dy.astype(np.int64), dx.astype(np.int64), flip


def augment(x: Array, positions: Array, key: int, crop_padding: int = 0, horizontal_flip: bool = False) -> Array:
    """The batch `x` cropped and flipped by each row's draws (`positions`: where `x` lives)."""
    xp = B.array_module(x)
    n, _, h, w = x.shape
    dy, dx, flip = draws(positions, key, crop_padding)
    if crop_padding:
        p = crop_padding
        padded = xp.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        rows = dy[:, None] + xp.arange(h)[None, :]                     # (N, H)
        cols = dx[:, None] + xp.arange(w)[None, :]                     # (N, W)
        batch = xp.arange(n)[:, None, None]
        x = padded.transpose(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].transpose(0, 3, 1, 2)
    if horizontal_flip:
        x = xp.where(flip[:, None, None, None], x[..., ::-1], x)
    return xp.ascontiguousarray(x)
