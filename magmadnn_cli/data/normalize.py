"""Input normalization and regression-target scaling, fitted on the training rows and stored with
the model: statistics computed in float64 (a block of columns at a time) and kept in the data's float
type; statistics that overflow are refused, naming the column."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..config.data import DataConfig
from ..core import backend as B
from ..errors import DataError


@dataclass
class Normalizer:
    """x -> (x * scale - shift) / spread per encoded column, fitted on the training split; one-hot,
    boolean and indicator columns are left as they are."""
    scale: float = 1.0
    shift: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    spread: np.ndarray = field(default_factory=lambda: np.ones(0, np.float32))

    @classmethod
    def fit(cls, x: np.ndarray, method: str, scale: float | None, numbers: np.ndarray | None = None,
            names: list[str] | None = None, source: str = "the data") -> "Normalizer":
        """Statistics computed in float64 (a block of columns at a time: no float64 copy of x) and
        kept in x's float type; a statistic that overflows is refused, naming its column."""
        s = float(scale or 1.0)
        flat = x.reshape(len(x), -1)
        width = flat.shape[1]
        shift, spread = np.zeros(width), np.ones(width)
        if method in ("minmax", "standard"):
            step = max(1, STATS_BLOCK // max(1, len(flat)))
            for j in range(0, width, step):
                shift[j:j + step], spread[j:j + step] = _statistics(flat[:, j:j + step], s, method)
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(B.current().floatx)
        largest = lambda j: float(np.abs(flat[:, j]).max())  # noqa: E731  (for the message only)
        return cls.of(shift, spread, s, method, numbers, dtype, names or [], source, largest)

    @classmethod
    def of(cls, shift: np.ndarray, spread: np.ndarray, s: float, method: str, numbers: np.ndarray | None,
           dtype: np.dtype, names: list[str], source: str, largest: Callable[[int], float]) -> "Normalizer":
        """From float64 statistics (as `fit` computes them, or merged block by block): columns other
        than numbers left as they are; a statistic that overflows refused (`largest(j)`: column j's
        largest magnitude, for the message)."""
        if numbers is not None and not numbers.all():  # other columns: (x * s - 0) / s = x
            shift, spread = np.where(numbers, shift, 0.0), np.where(numbers, spread, s)
        _check_statistics(shift, spread, method, dtype, names, source, largest)
        return cls(s, shift.astype(dtype), spread.astype(dtype))

    def __call__(self, x: np.ndarray, own: bool = False) -> np.ndarray:
        """x scaled and normalized, in x's float type (else the run's); `own`: x is the caller's to
        overwrite (a fresh copy), so the result is computed in it where the type allows."""
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(B.current().floatx)
        flat = x.reshape(len(x), int(np.prod(x.shape[1:])))  # (no rows too)
        out = flat if own and flat.dtype == dtype and flat.flags.writeable else flat.astype(dtype)
        if self.scale != 1.0:
            np.multiply(out, dtype.type(self.scale), out=out)
        np.subtract(out, self.shift.astype(dtype), out=out)
        np.divide(out, self.spread.astype(dtype), out=out)  # one copy of x at most, not three
        return out.reshape(x.shape)


STATS_BLOCK = 1 << 21  # values per block of columns whose statistics are computed in float64 (16 MiB)


def _statistics(block: np.ndarray, s: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """(shift, spread) of a block of columns in float64: the minimum and the range, or the mean and
    the standard deviation (1 for a constant column); inf or NaN where they overflow."""
    values = block.astype(np.float64) * s
    with np.errstate(over="ignore", invalid="ignore"):
        if method == "minmax":
            low, high = values.min(axis=0), values.max(axis=0)
            return low, np.where(high > low, high - low, 1.0)
        std = values.std(axis=0)
        return values.mean(axis=0), np.where(std > 0, std, 1.0)


def _check_statistics(shift: np.ndarray, spread: np.ndarray, method: str, dtype: np.dtype, names: list[str],
                      source: str, largest_of: Callable[[int], float]) -> None:
    """Refuse statistics that overflowed in float64, or that do not fit the run's float type, naming
    the first such column, its largest value and the fix."""
    with np.errstate(over="ignore", invalid="ignore"):
        bad = ~(np.isfinite(shift.astype(dtype)) & np.isfinite(spread.astype(dtype)))
    if not bad.any():
        return
    j = int(np.flatnonzero(bad)[0])
    name = names[j] if j < len(names) else f"input {j + 1}"
    largest = largest_of(j)
    what = "range (maximum - minimum)" if method == "minmax" else "standard deviation"
    where = "overflows float64" if not (np.isfinite(shift[j]) and np.isfinite(spread[j])) else \
        f"does not fit {dtype.name} (precision: {dtype.name}; precision: float64 would hold it)"
    divide = f"e.g. divide it by {10.0 ** np.floor(np.log10(largest)):.0e}" if 1 < largest < np.inf else "or data.scale"
    raise DataError(f"{source}: data.normalize: {method} cannot scale column {name!r}: its {what}, computed in float64, "
                    f"{where} (its values reach {largest:.3g}; {int(bad.sum())} column(s) in all). Rescale the "
                    f"column in the file ({divide}), or leave it out (data.columns.{name}: ignore)")


@dataclass
class TargetScaler:
    """Regression targets y -> (y - shift) / spread (fitted on training rows); `restore` maps
    outputs back to the data's units. The identity for classification."""
    shift: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spread: np.ndarray = field(default_factory=lambda: np.ones(0))

    @classmethod
    def fit(cls, y: np.ndarray, source: str = "the data") -> "TargetScaler":
        """Mean and standard deviation in float64; refused where they overflow (values near 1e300)."""
        with np.errstate(over="ignore", invalid="ignore"):
            std, mean = y.std(axis=0, dtype=np.float64), y.mean(axis=0, dtype=np.float64)
        if not (np.isfinite(std).all() and np.isfinite(mean).all()):
            raise DataError(f"{source}: the regression target's standard deviation, computed in float64, overflows "
                            f"float64 (its values reach {float(np.abs(y).max()):.3g}); rescale the target in the file, "
                            "or set data.target_normalize: none")
        return cls(mean, np.where(std > 0, std, 1.0))

    @property
    def active(self) -> bool:
        return self.shift.size > 0

    def __call__(self, y: np.ndarray) -> np.ndarray:
        return ((y - self.shift) / self.spread).astype(y.dtype) if self.active else y

    def restore(self, out: np.ndarray) -> np.ndarray:
        return (out * self.spread + self.shift).astype(out.dtype) if self.active else out


def normalize_method(cfg: DataConfig, x: np.ndarray) -> str:
    """`data.normalize` resolved: auto standardizes tables (flat rows) and leaves as read (and scaled)
    images and features the config scales itself (`data.scale`, e.g. pixels 0-255 -> 0-1)."""
    if cfg.normalize != "auto":
        return cfg.normalize
    return "standard" if x.ndim == 2 and cfg.scale is None else "none"


SCALE_GAP = 100.0  # number columns whose spreads differ more than this train poorly unscaled


def scale_note(x: np.ndarray, cfg: DataConfig, numbers: np.ndarray | None, names: list[str]) -> str | None:
    """With `normalize: none` chosen, one line when number columns differ in scale by more than
    SCALE_GAP times, naming the widest and narrowest and the fix."""
    if cfg.normalize != "none" or x.ndim != 2 or len(x) < 2:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        std = x.astype(np.float64).std(axis=0) * float(cfg.scale or 1.0)
    usable = (std > 0) & (numbers if numbers is not None else True)
    if usable.sum() < 2:
        return None
    cols = np.flatnonzero(usable)
    wide, narrow = cols[np.argmax(std[cols])], cols[np.argmin(std[cols])]
    if std[wide] <= SCALE_GAP * std[narrow]:
        return None
    name = (lambda j: names[j] if j < len(names) else f"column {j + 1}")  # noqa: E731  a one-line namer, local to this message
    return (f"data.normalize: none, but the number columns differ in scale by {std[wide] / std[narrow]:,.0f}x "
            f"(widest: {name(wide)}, std {std[wide]:.4g}; narrowest: {name(narrow)}, std {std[narrow]:.4g}): "
            "training may be slow or poor. Fix: data.normalize: standard (or leave the key out: auto "
            "standardizes number columns)")
