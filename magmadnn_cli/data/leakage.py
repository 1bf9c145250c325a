"""Feature columns that are the target in disguise: a copy of a regression target (or a rescaling of
it), or a column whose values stand one-to-one for the classes. The network learns to read them
and scores perfectly, while the rows it will predict do not hold the answer: said once in the run log."""

from __future__ import annotations

import numpy as np

from .columns import RawColumns

ROWS = 20       # fewer training rows say nothing
WIDEST = 200    # columns checked at most (image-like tables are not checked)


def target_copies(raw: RawColumns, names: list[str], y: np.ndarray, task: str, target: str | None) -> list[str]:
    """The run-log warning naming the training columns that are the target in disguise; [] if none."""
    y = y.reshape(len(y), -1)
    if len(y) < ROWS or len(names) > WIDEST or y.shape[1] != 1:
        return []
    numbers = [j for j in range(len(names)) if j not in raw.text]
    if task == "regression":
        found = [names[j] for j in np.array(numbers, dtype=np.int64)[_rescaled(raw.x[:, numbers], y[:, 0])]]
        how = f"equal the target {target!r} (or a rescaling of it) in every training row"
    else:
        classes = np.unique(y[:, 0].astype(np.int64), return_inverse=True)[1].reshape(-1)
        columns = [raw.x[:, numbers]] + [raw.text[j][:, None] for j in sorted(raw.text)]
        order = numbers + sorted(raw.text)
        found = [names[order[i]] for i in np.flatnonzero(np.concatenate([_one_to_one(c, classes) for c in columns]))]
        how = f"stand one-to-one for the classes of the target {target!r} in the training rows"
    if not found:
        return []
    listed = ", ".join(repr(name) for name in found[:5]) + (", ..." if len(found) > 5 else "")
    return [f"column(s) {listed} {how}: a copy of the answer? The network learns to read it, and rows to predict "
            f"will not hold it; data.columns.{found[0]}: ignore leaves it out"]


def _rescaled(x: np.ndarray, y: np.ndarray, sample: int = 64) -> np.ndarray:
    """Per column: complete, varying and an affine image of the target (|correlation| = 1); the
    columns that are so on `sample` rows are checked on all."""
    found = _affine(x[:sample], y[:sample])
    if found.any():
        found[found] = _affine(x[:, found], y)
    return found


def _affine(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x, t = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(all="ignore"):  # values whose squares overflow are no copy of anything: r is NaN
        spread, t_spread = x.std(axis=0), t.std()
        if not x.shape[1] or not t_spread > 0:
            return np.zeros(x.shape[1], dtype=bool)
        r = ((x - x.mean(axis=0)) * (t - t.mean())[:, None]).mean(axis=0) / (spread * t_spread)
    return np.isfinite(r) & (spread > 0) & (np.abs(r) > 1 - 1e-9)


def _one_to_one(x: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Per column of `x`: the same value in every row of a class, and a different one per class
    (2 or more classes); classes are 0..k-1, each present."""
    if not x.shape[1] or classes.max() < 1:
        return np.zeros(x.shape[1], dtype=bool)
    first = np.array([np.argmax(classes == k) for k in range(int(classes.max()) + 1)])
    representative = x[first]  # each class's value, where the column is constant within classes
    same = (x == representative[classes]).all(axis=0)
    distinct = np.array([len(set(representative[:, j].tolist())) == len(first) for j in range(x.shape[1])])
    return same & distinct
