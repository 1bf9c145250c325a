"""Evaluation metrics from predictions and targets (host numpy arrays); each report is built from sums
(`ClassSums`, `RegressionSums`, `MultiLabelSums`) that a streamed evaluation adds batch by batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np


CONFUSION_MAX_CLASSES = 50  # above this many classes the confusion matrix is summarized, not written out
MOST_CONFUSED = 20          # the (true, predicted) pairs a summary keeps
SUMS_ROWS = 1 << 20         # rows counted at a time


def in_chunks(*arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """The arrays' rows SUMS_ROWS at a time, as int64 (class indices kept a byte a row, counted
    without an int64 copy of every row: a streamed run's 50 M)."""
    for lo in range(0, len(arrays[0]), SUMS_ROWS):
        yield tuple(a[lo:lo + SUMS_ROWS].astype(np.int64) for a in arrays)


def class_counts(y: np.ndarray, classes: int) -> np.ndarray:
    """The rows of each class (class indices)."""
    return sum((np.bincount(chunk, minlength=classes) for chunk, in in_chunks(y.reshape(-1))),
               np.zeros(classes, np.int64))


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, classes: int) -> np.ndarray:
    """Rows: true class; columns: predicted class."""
    return np.bincount(y_true * classes + y_pred, minlength=classes * classes).reshape(classes, classes)


def classification_report(y_true: np.ndarray, y_pred: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    """Accuracy, macro F1, MCC and per-class precision/recall/F1/support, from per-class counts (no
    k x k matrix is needed); the confusion matrix itself up to CONFUSION_MAX_CLASSES classes, above
    them its summary (`confusion_summary`)."""
    sums = ClassSums(labels)
    sums.add(y_true, y_pred)
    return sums.report()


def counts_report(tp: np.ndarray, predicted: np.ndarray, actual: np.ndarray, rows: int,
                  labels: list[Any]) -> dict[str, Any]:
    """`classification_report`'s scores from per-class true positives, predicted and true counts."""
    k, tp, predicted, actual = len(labels), tp.astype(float), predicted.astype(np.int64), actual.astype(np.int64)
    precision = np.divide(tp, predicted, out=np.zeros(k), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros(k), where=actual > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(k), where=precision + recall > 0)
    present = (actual > 0) | (predicted > 0)  # scikit-learn's macro average: the labels that occur
    return {
        "accuracy": float(tp.sum() / max(1, rows)),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "mcc": _matthews(float(tp.sum()), float(rows), predicted.astype(float), actual.astype(float)),
        "per_class": {str(label): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                      for label, p, r, f, s in zip(labels, precision, recall, f1, actual)},
        "labels": [str(label) for label in labels],
    }


class ClassSums:
    """A classifier's rows counted batch by batch (per class, and each wrong (true, predicted) cell):
    `classification_report`'s numbers without holding the rows."""

    def __init__(self, labels: list[Any]) -> None:
        k = len(labels)
        self.labels, self.rows = labels, 0
        self.tp, self.predicted, self.actual = (np.zeros(k, np.int64) for _ in range(3))
        self.cells, self.counts = np.zeros(0, np.int64), np.zeros(0, np.int64)  # wrong cells: true * k + predicted

    def add(self, y_true: np.ndarray, y_pred: np.ndarray) -> None:
        """Count the rows (`in_chunks`)."""
        for true, predicted in in_chunks(y_true, y_pred):
            self._add(true, predicted)

    def _add(self, y_true: np.ndarray, y_pred: np.ndarray) -> None:
        k = len(self.labels)
        self.rows += len(y_true)
        self.tp += np.bincount(y_true[y_true == y_pred], minlength=k)
        self.predicted += np.bincount(y_pred, minlength=k)
        self.actual += np.bincount(y_true, minlength=k)
        wrong = y_true != y_pred
        cells, inverse = np.unique(np.concatenate([self.cells, y_true[wrong] * k + y_pred[wrong]]), return_inverse=True)
        weights = np.concatenate([self.counts, np.ones(int(wrong.sum()), np.int64)])
        self.cells, self.counts = cells, np.bincount(inverse.reshape(-1), weights, len(cells)).astype(np.int64)

    def report(self) -> dict[str, Any]:
        k = len(self.labels)
        report = counts_report(self.tp, self.predicted, self.actual, self.rows, self.labels)
        if k <= CONFUSION_MAX_CLASSES:
            matrix = np.zeros(k * k, np.int64)
            matrix[self.cells] = self.counts
            matrix[np.arange(k) * (k + 1)] = self.tp
            report["confusion_matrix"] = matrix.reshape(k, k).tolist()
        else:
            report["confusion_summary"] = _summary(self.cells, self.counts, self.labels)
        return report


def confusion_summary(y_true: np.ndarray, y_pred: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    """The confusion matrix of many classes, summarized: its MOST_CONFUSED largest off-diagonal cells
    (true, predicted, rows), counted over the wrong rows only (memory of the rows, not k x k)."""
    wrong = y_true != y_pred
    cells, counts = np.unique(y_true[wrong] * len(labels) + y_pred[wrong], return_counts=True)
    return _summary(cells, counts, labels)


def _summary(cells: np.ndarray, counts: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    """`confusion_summary` from the wrong cells (sorted) and their counts."""
    top = np.argsort(-counts, kind="stable")[:MOST_CONFUSED]
    return {"classes": len(labels), "wrong": int(counts.sum()),
            "most_confused": [{"true": str(labels[cells[i] // len(labels)]), "predicted": str(labels[cells[i] % len(labels)]),
                               "count": int(counts[i])} for i in top]}


def matthews(cm: np.ndarray) -> float:
    """Matthews correlation coefficient, multi-class form (Gorodkin 2004); 0 when undefined."""
    cm = cm.astype(float)
    return _matthews(float(np.trace(cm)), float(cm.sum()), cm.sum(axis=0), cm.sum(axis=1))


def _matthews(correct: float, n: float, p: np.ndarray, t: np.ndarray) -> float:
    """MCC from the correct count, the row count and the per-class predicted (p) and true (t) counts."""
    denominator = np.sqrt((n * n - (p * p).sum()) * (n * n - (t * t).sum()))
    return float((correct * n - (p * t).sum()) / denominator) if denominator > 0 else 0.0


def regression_report(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, Any]:
    """MSE, RMSE (in the data's units) and MAE over all values; R2 per output column (1 - SSE / SST; 0 for a constant column)
    and their mean as `r2` (scikit-learn's uniform average)."""
    sums = RegressionSums()
    sums.add(y_true, y_pred)
    return sums.report()


def multilabel_report(y_true: np.ndarray, y_pred: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    """Multi-label scores from 0/1 matrices (rows x labels), as scikit-learn defines them: `accuracy`
    over every (row, label) cell (1 - Hamming loss), `subset_accuracy` (rows with every label right),
    micro (pooled counts) and macro (mean over labels) precision, recall and F1, and per-label ones."""
    sums = MultiLabelSums(labels)
    sums.add(y_true, y_pred)
    return sums.report()


@dataclass
class Moments:
    """Per-column count, mean and sum of squared deviations of the values seen (NaN skipped), merged
    block by block exactly (Chan, Golub & LeVeque's pairwise update)."""
    count: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(len(x), -1)
        missing = np.isnan(x)
        if not missing.any():  # (the usual case: sums without NaN masks, twice as fast)
            n = np.full(x.shape[1], float(len(x)))
            mean = x.sum(axis=0) / max(1, len(x))
            self.merge(Moments(n, mean, ((x - mean) ** 2).sum(axis=0)))
            return
        n = (~missing).sum(axis=0).astype(np.float64)
        mean = np.where(n > 0, np.nansum(x, axis=0) / np.maximum(n, 1), 0.0)
        self.merge(Moments(n, mean, np.nansum((x - mean) ** 2, axis=0)))

    def merge(self, other: "Moments") -> None:
        if not len(self.count):
            self.count, self.mean, self.m2 = other.count.copy(), other.mean.copy(), other.m2.copy()
            return
        total = self.count + other.count
        share = np.where(total > 0, other.count / np.maximum(total, 1), 0.0)
        delta = other.mean - self.mean
        self.m2 = self.m2 + other.m2 + delta ** 2 * self.count * share
        self.mean, self.count = self.mean + delta * share, total

    @property
    def variance(self) -> np.ndarray:
        """The population variance (ddof 0), as numpy's var."""
        return np.where(self.count > 0, self.m2 / np.maximum(self.count, 1), 0.0)


class RegressionSums:
    """Regression rows summed batch by batch (squared and absolute errors; the truth's exact moments
    per column): `regression_report`'s numbers without holding the rows."""

    def __init__(self) -> None:
        self.sse, self.abs_sum, self.cells, self.truth = 0.0, 0.0, 0, Moments()

    def add(self, y_true: np.ndarray, y_pred: np.ndarray) -> None:
        truth = y_true.astype(np.float64).reshape(len(y_true), -1)
        err = y_pred.astype(np.float64).reshape(truth.shape) - truth
        self.sse = self.sse + (err ** 2).sum(axis=0)
        self.abs_sum, self.cells = self.abs_sum + float(np.abs(err).sum()), self.cells + err.size
        self.truth.add(truth)

    def report(self) -> dict[str, Any]:
        sse, sst = np.atleast_1d(self.sse), self.truth.m2 if len(self.truth.m2) else np.zeros(0)
        r2 = 1.0 - np.divide(sse, sst, out=np.ones_like(sse), where=sst > 0) if sst.size else np.zeros(0)
        mse = float(sse.sum() / self.cells) if self.cells else float("nan")
        report: dict[str, Any] = {"mse": mse, "rmse": float(np.sqrt(mse)),
                                  "mae": float(self.abs_sum / self.cells) if self.cells else float("nan"),
                                  "r2": float(r2.mean()) if r2.size else 0.0}
        if r2.size > 1:
            report["r2_per_output"] = [float(v) for v in r2]
        return report


class MultiLabelSums:
    """Multi-label rows counted batch by batch (per label; right cells and rows): `multilabel_report`'s
    numbers without holding the rows."""

    def __init__(self, labels: list[Any]) -> None:
        self.labels, self.rows, self.right_rows, self.right_cells = labels, 0, 0, 0
        self.tp, self.predicted, self.actual = (np.zeros(len(labels)) for _ in range(3))

    def add(self, y_true: np.ndarray, y_pred: np.ndarray) -> None:
        y_true, y_pred = y_true.astype(bool), y_pred.astype(bool)
        self.tp += (y_true & y_pred).sum(axis=0)
        self.predicted += y_pred.sum(axis=0)
        self.actual += y_true.sum(axis=0)
        cells = y_true == y_pred
        self.rows, self.right_rows = self.rows + len(cells), self.right_rows + int(cells.all(axis=1).sum())
        self.right_cells += int(cells.sum())

    def report(self) -> dict[str, Any]:
        tp, predicted, actual, size = self.tp, self.predicted, self.actual, self.rows * len(self.labels)
        precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
        recall = np.divide(tp, actual, out=np.zeros_like(tp), where=actual > 0)
        f1 = np.divide(2 * tp, predicted + actual, out=np.zeros_like(tp), where=predicted + actual > 0)
        pooled, right = predicted.sum() + actual.sum(), self.right_cells / size if size else 0.0
        return {
            "accuracy": float(right), "subset_accuracy": float(self.right_rows / self.rows) if self.rows else 0.0,
            "hamming_loss": float(1 - right) if size else 0.0,
            "micro_precision": float(tp.sum() / predicted.sum()) if predicted.sum() else 0.0,
            "micro_recall": float(tp.sum() / actual.sum()) if actual.sum() else 0.0,
            "micro_f1": float(2 * tp.sum() / pooled) if pooled else 0.0,
            "macro_precision": float(precision.mean()) if len(tp) else 0.0,
            "macro_recall": float(recall.mean()) if len(tp) else 0.0,
            "macro_f1": float(f1.mean()) if len(tp) else 0.0,
            "per_label": {str(label): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                          for label, p, r, f, s in zip(self.labels, precision, recall, f1, actual)},
            "labels": [str(label) for label in self.labels],
        }


def report_sums(rule: Any, labels: list[Any]) -> ClassSums | RegressionSums | MultiLabelSums:
    """The sums a task's report is built from (`rule`: its runtime task, data/targets.py)."""
    if not rule.decl.labels:
        return RegressionSums()
    return MultiLabelSums(labels) if rule.decl.name == "multilabel" else ClassSums(labels)
