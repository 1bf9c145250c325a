"""Counter-based random numbers (the idea of Philox / JAX's PRNG): a number is a pure function of
(key, counter), so any process can draw exactly the numbers of any sample without a stream to
advance or save. The mixing function is SplitMix64's finaliser applied to a Weyl sequence
(Steele, Lea & Flood 2014), which passes BigCrush; vectorized in numpy or cupy uint64 arithmetic
(wrap-around multiplication is what the hash needs).

Data-parallel use: a value for sample s (its position in the epoch's global order) and element j
comes from counter s * per_sample + j, so N ranks draw what one process draws, each at the cost of
its own samples only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any
MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix(value: int) -> int:
    """SplitMix64's finaliser on a Python int (for deriving keys)."""
    z = value & MASK
    z = ((z ^ (z >> 30)) * MIX1) & MASK
    z = ((z ^ (z >> 27)) * MIX2) & MASK
    return z ^ (z >> 31)


def _is_array(value: Any) -> bool:
    return hasattr(value, "dtype") and not isinstance(value, np.generic)


def derive_key(*parts: Any) -> Any:
    """A 64-bit key from integers (seed, epoch, stream, ...): equal parts, equal key. A part may be a
    0-d uint64 array (a key kept on the device, as a captured step reads it): from there on the key is
    computed where that array lives, as a 0-d array equal to the integers' key."""
    key, on_device = 0, None
    for part in parts:
        if on_device is None and not _is_array(part):
            key = mix(key + GOLDEN + (int(part) & MASK))
            continue
        if on_device is None:
            z = part.astype(np.uint64, copy=True)
            z += np.uint64((key + GOLDEN) & MASK)
        else:
            z = on_device.copy()
            z += part if _is_array(part) else np.uint64((GOLDEN + (int(part) & MASK)) & MASK)
            if _is_array(part):
                z += np.uint64(GOLDEN)
        on_device = _mix_array(z, None)
    return key if on_device is None else on_device


def _mix_array(z: Array, xp: Any) -> Array:
    z ^= z >> np.uint64(30)
    z *= np.uint64(MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(MIX2)
    z ^= z >> np.uint64(31)
    return z


def bits64(key: int, positions: Array, per_sample: int, xp: Any = np) -> Array:
    """(len(positions), per_sample) uint64 random bits: element j of sample s from counter
    s * per_sample + j under `key`."""
    pos = xp.asarray(positions, dtype=np.uint64).reshape(-1, 1)
    z = pos * np.uint64(per_sample) + xp.arange(per_sample, dtype=np.uint64)[None, :]
    z += np.uint64(1)
    z *= np.uint64(GOLDEN)
    z += key if _is_array(key) else np.uint64(key)
    return _mix_array(z, xp)


def bits32(key: int, positions: Array, per_sample: int, xp: Any = np) -> Array:
    """(len(positions), per_sample) uint32 random bits: both halves of ceil(per_sample / 2) 64-bit
    draws per sample (half the hashing of one draw per element)."""
    half = (per_sample + 1) // 2
    wide = bits64(key, positions, half, xp)
    return wide.view(np.uint32)[:, :per_sample]


def keep_mask(key: int, positions: Array, shape: tuple[int, ...], rate: float, dtype: Any, xp: Any = np) -> Array:
    """Inverted-dropout multipliers for a batch of `shape` (first axis = samples): 1 / (1 - rate)
    where a sample's element is kept (probability 1 - rate, to 2^-32), else 0."""
    per_sample = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    threshold = np.uint32(min(int(round(rate * 2.0**32)), 2**32 - 1))
    keep = bits32(key, positions, per_sample, xp) >= threshold
    mask = keep.astype(dtype)
    mask *= dtype(1.0 / (1.0 - rate))
    return mask.reshape(shape)
