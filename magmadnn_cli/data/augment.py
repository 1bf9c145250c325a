"""Light, seeded image augmentation for NCHW training batches: random crops of a zero-padded image
and horizontal flips, vectorized over the batch (no per-sample loop)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import backend as B

Array = Any


def augment(x: Array, rng: np.random.Generator, crop_padding: int = 0, horizontal_flip: bool = False) -> Array:
    xp = B.array_module(x)
    n, _, h, w = x.shape
    if crop_padding:
        p = crop_padding
        padded = xp.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        dy = B.to_device(rng.integers(0, 2 * p + 1, n)) if xp is not np else rng.integers(0, 2 * p + 1, n)
        dx = B.to_device(rng.integers(0, 2 * p + 1, n)) if xp is not np else rng.integers(0, 2 * p + 1, n)
        rows = dy[:, None] + xp.arange(h)[None, :]                     # (N, H)
        cols = dx[:, None] + xp.arange(w)[None, :]                     # (N, W)
        batch = xp.arange(n)[:, None, None]
        x = padded.transpose(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].transpose(0, 3, 1, 2)
    if horizontal_flip:
        flip = rng.random(n) < 0.5
        mask = B.to_device(flip) if xp is not np else flip
        x = xp.where(mask[:, None, None, None], x[..., ::-1], x)
    return xp.ascontiguousarray(x)
