"""Feature columns that are the target in disguise: a copy of a regression target (or a rescaling of
it), or a column whose values stand one-to-one for the classes. The network learns to read them
and scores perfectly, while the rows it will predict do not hold the answer: said once in the run log."""

from __future__ import annotations

import numpy as np

from ..config.tasks import task_named
from .cells import RawColumns

ROWS = 20       # fewer training rows say nothing
WIDEST = 200    # columns checked at most (image-like tables are not checked)


def target_copies(raw: RawColumns, names: list[str], y: np.ndarray, task: str, target: str | None) -> list[str]:
    """The run-log warning naming the training columns that are the target in disguise; [] if none."""
    y = y.reshape(len(y), -1)
    if len(y) < ROWS or len(names) > WIDEST or y.shape[1] != 1:
        return []
    numbers = [j for j in range(len(names)) if j not in raw.text]
    if not task_named(task).labels:
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


REPEATED = 0.05  # the share of held-out rows repeating training rows that is said
BLOCK = 4096     # rows hashed at a time


def repeated_rows(train_x: np.ndarray, train_y: np.ndarray, held_x: np.ndarray, held_y: np.ndarray) -> int:
    """How many held-out rows repeat a training row exactly, features and target together (by a
    64-bit hash of each row's bytes, in blocks: memory of one block, not of the table)."""
    if not len(held_x) or not len(train_x):
        return 0
    return int(np.isin(_row_hashes(held_x, held_y), _row_hashes(train_x, train_y)).sum())


def _row_hashes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A random linear hash modulo 2^64 of each row's 32-bit words (features, then the target)."""
    x, y = x.reshape(len(x), -1), np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    width = (x.shape[1] * x.dtype.itemsize + y.shape[1] * 8) // 4
    weights = np.random.default_rng(0).integers(0, 2**64 - 1, width, dtype=np.uint64, endpoint=True)
    hashes = np.empty(len(x), dtype=np.uint64)
    for start in range(0, len(x), BLOCK):
        block = np.concatenate([np.ascontiguousarray(x[start:start + BLOCK]).view(np.uint32),
                                np.ascontiguousarray(y[start:start + BLOCK]).view(np.uint32)], axis=1)
        hashes[start:start + BLOCK] = (block.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    return hashes


def column_codes(raw: RawColumns) -> np.ndarray:
    """Each source column's cells as integer codes (rows x columns): one column per category, not per
    one-hot unit, for `chance_share` (a 2-value category is one column of two values)."""
    codes = np.empty(raw.x.shape[:2], dtype=np.int64)
    for j in range(raw.x.shape[1]):
        cells = raw.text[j] if j in raw.text else raw.x[:, j]
        codes[:, j] = np.unique(cells, return_inverse=True)[1].reshape(-1)
    return codes


def chance_share(x: np.ndarray, sample: int = 5000) -> float:
    """The share of held-out rows that would match a training row by coincidence, were the columns
    independent: the distinct training rows x the product of each column's collision probability. Both
    are judged on the distinct rows (of a sample), so that copies of one record, the thing looked
    for, do not pass for values that recur by nature (records of few distinct values repeat)."""
    x = x.reshape(len(x), -1)
    rows = x[np.random.default_rng(0).choice(len(x), sample, replace=False)] if len(x) > sample else x
    distinct = np.unique(rows, axis=0)
    n, log_match = len(distinct), 0.0
    if n < 2:
        return 0.0
    for j in range(distinct.shape[1]):
        counts = np.unique(distinct[:, j], return_counts=True)[1].astype(np.float64)
        collision = (np.sum(counts * counts) - n) / (n * (n - 1))
        if collision <= 0:
            return 0.0
        log_match += np.log(collision)
    return float(min(1.0, len(x) * n / len(rows) * np.exp(log_match)))  # distinct rows: disjoint matches


def repeats_note(repeats: dict[str, tuple[int, int]], chance: float, source: str) -> str | None:
    """The run-log warning for held-out parts ({name: (repeating rows, rows)}) of which at least
    REPEATED, and three times what coincidence gives (`chance`), repeat training rows; None if none."""
    named = {k: (n, total) for k, (n, total) in repeats.items()
             if total and n >= 2 and n >= total * max(REPEATED, 3 * chance)}
    if not named:
        return None
    parts = "; ".join(f"{name}: {n} of its {total} rows ({100 * n / total:.0f}%)" for name, (n, total) in named.items())
    return (f"held-out rows repeat a training row exactly, features and target ({parts}), far more than coincidence "
            f"gives ({100 * chance:.1f}%): their scores count them as unseen, and read high. If {source} holds "
            "duplicate records, remove them before training")
