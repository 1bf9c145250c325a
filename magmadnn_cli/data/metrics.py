"""Evaluation metrics from predictions and targets (host numpy arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np


CONFUSION_MAX_CLASSES = 50  # above this many classes the confusion matrix is summarized, not written out
MOST_CONFUSED = 20          # the (true, predicted) pairs a summary keeps


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, classes: int) -> np.ndarray:
    """Rows: true class; columns: predicted class."""
    return np.bincount(y_true * classes + y_pred, minlength=classes * classes).reshape(classes, classes)


def classification_report(y_true: np.ndarray, y_pred: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    """Accuracy, macro F1, MCC and per-class precision/recall/F1/support, from per-class counts (no
    k x k matrix is needed); the confusion matrix itself up to CONFUSION_MAX_CLASSES classes, above
    them its summary (`confusion_summary`)."""
    k = len(labels)
    y_true, y_pred = y_true.astype(np.int64), y_pred.astype(np.int64)
    tp = np.bincount(y_true[y_true == y_pred], minlength=k).astype(float)
    predicted, actual = np.bincount(y_pred, minlength=k), np.bincount(y_true, minlength=k)
    precision = np.divide(tp, predicted, out=np.zeros(k), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros(k), where=actual > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(k), where=precision + recall > 0)
    present = (actual > 0) | (predicted > 0)  # scikit-learn's macro average: the labels that occur
    report = {
        "accuracy": float(tp.sum() / max(1, len(y_true))),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "mcc": _matthews(float(tp.sum()), float(len(y_true)), predicted.astype(float), actual.astype(float)),
        "per_class": {str(label): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                      for label, p, r, f, s in zip(labels, precision, recall, f1, actual)},
        "labels": [str(label) for label in labels],
    }
    if k <= CONFUSION_MAX_CLASSES:
        report["confusion_matrix"] = confusion_matrix(y_true, y_pred, k).tolist()
    else:
        report["confusion_summary"] = confusion_summary(y_true, y_pred, labels)
    return report


def confusion_summary(y_true: np.ndarray, y_pred: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    """The confusion matrix of many classes, summarized: its MOST_CONFUSED largest off-diagonal cells
    (true, predicted, rows), counted over the wrong rows only (memory of the rows, not k x k)."""
    wrong = y_true != y_pred
    cells, counts = np.unique(y_true[wrong] * len(labels) + y_pred[wrong], return_counts=True)
    top = np.argsort(-counts, kind="stable")[:MOST_CONFUSED]
    return {"classes": len(labels), "wrong": int(wrong.sum()),
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
    truth = y_true.astype(np.float64).reshape(len(y_true), -1)
    err = y_pred.astype(np.float64).reshape(truth.shape) - truth
    sse, sst = (err ** 2).sum(axis=0), ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)
    r2 = np.divide(sse, sst, out=np.ones_like(sse), where=sst > 0)
    r2 = 1.0 - r2
    mse = float((err ** 2).mean())
    report: dict[str, Any] = {"mse": mse, "rmse": float(np.sqrt(mse)), "mae": float(np.abs(err).mean()),
                              "r2": float(r2.mean()) if r2.size else 0.0}
    if r2.size > 1:
        report["r2_per_output"] = [float(v) for v in r2]
    return report


def multilabel_report(y_true: np.ndarray, y_pred: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    """Multi-label scores from 0/1 matrices (rows x labels), as scikit-learn defines them: `accuracy`
    over every (row, label) cell (1 - Hamming loss), `subset_accuracy` (rows with every label right),
    micro (pooled counts) and macro (mean over labels) precision, recall and F1, and per-label ones."""
    y_true, y_pred = y_true.astype(bool), y_pred.astype(bool)
    tp = (y_true & y_pred).sum(axis=0).astype(float)
    predicted, actual = y_pred.sum(axis=0).astype(float), y_true.sum(axis=0).astype(float)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros_like(tp), where=actual > 0)
    f1 = np.divide(2 * tp, predicted + actual, out=np.zeros_like(tp), where=predicted + actual > 0)
    micro_p = tp.sum() / predicted.sum() if predicted.sum() else 0.0
    micro_r = tp.sum() / actual.sum() if actual.sum() else 0.0
    pooled = predicted.sum() + actual.sum()
    cells = (y_true == y_pred)
    return {
        "accuracy": float(cells.mean()) if cells.size else 0.0,
        "subset_accuracy": float(cells.all(axis=1).mean()) if len(cells) else 0.0,
        "hamming_loss": float(1 - cells.mean()) if cells.size else 0.0,
        "micro_precision": float(micro_p), "micro_recall": float(micro_r),
        "micro_f1": float(2 * tp.sum() / pooled) if pooled else 0.0,
        "macro_precision": float(precision.mean()) if len(tp) else 0.0,
        "macro_recall": float(recall.mean()) if len(tp) else 0.0,
        "macro_f1": float(f1.mean()) if len(tp) else 0.0,
        "per_label": {str(label): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                      for label, p, r, f, s in zip(labels, precision, recall, f1, actual)},
        "labels": [str(label) for label in labels],
    }
