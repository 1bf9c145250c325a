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


def draws(positions: np.ndarray, key: int, crop_padding: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: vertical and horizontal crop offsets in [0, 2 * crop_padding] and a flip bit."""
    bits = bits64(derive_key(key, STREAM), np.asarray(positions), 1)[:, 0]
    span = np.uint64(2 * crop_padding + 1)
    dy = (bits & np.uint64(0xFFFF)) % span
    dx = ((bits >> np.uint64(16)) & np.uint64(0xFFFF)) % span
    flip = ((bits >> np.uint64(63)) & np.uint64(1)).astype(bool)
    return dy.astype(np.int64), dx.astype(np.int64), flip


def augment(x: Array, positions: np.ndarray, key: int, crop_padding: int = 0, horizontal_flip: bool = False) -> Array:
    xp = B.array_module(x)
    n, _, h, w = x.shape
    dy, dx, flip = (B.to_device(a) if xp is not np else a for a in draws(positions, key, crop_padding))
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
