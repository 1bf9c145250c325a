"""Evaluation metrics from predictions and targets (host numpy arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, classes: int) -> np.ndarray:
    """Rows: true class; columns: predicted class."""
    return np.bincount(y_true * classes + y_pred, minlength=classes * classes).reshape(classes, classes)


def classification_report(y_true: np.ndarray, y_pred: np.ndarray, labels: list[Any]) -> dict[str, Any]:
    k = len(labels)
    cm = confusion_matrix(y_true.astype(np.int64), y_pred.astype(np.int64), k)
    tp = np.diag(cm).astype(float)
    predicted, actual = cm.sum(axis=0), cm.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros(k), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros(k), where=actual > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(k), where=precision + recall > 0)
    present = (actual > 0) | (predicted > 0)  # scikit-learn's macro average: the labels that occur
    return {
        "accuracy": float(tp.sum() / max(1, cm.sum())),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "mcc": matthews(cm),
        "per_class": {str(label): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                      for label, p, r, f, s in zip(labels, precision, recall, f1, actual)},
        "confusion_matrix": cm.tolist(),
        "labels": [str(label) for label in labels],
    }


def matthews(cm: np.ndarray) -> float:
    """Matthews correlation coefficient, multi-class form (Gorodkin 2004); 0 when undefined."""
    cm = cm.astype(float)
    n = cm.sum()
    correct = np.trace(cm)
    p, t = cm.sum(axis=0), cm.sum(axis=1)
    denominator = np.sqrt((n * n - (p * p).sum()) * (n * n - (t * t).sum()))
    return float((correct * n - (p * t).sum()) / denominator) if denominator > 0 else 0.0


def regression_report(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, Any]:
    """MSE and MAE over all values; R2 per output column (1 - SSE / SST; 0 for a constant column)
    and their mean as `r2` (scikit-learn's uniform average)."""
    truth = y_true.astype(np.float64).reshape(len(y_true), -1)
    err = y_pred.astype(np.float64).reshape(truth.shape) - truth
    sse, sst = (err ** 2).sum(axis=0), ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)
    r2 = np.divide(sse, sst, out=np.ones_like(sse), where=sst > 0)
    r2 = 1.0 - r2
    report: dict[str, Any] = {"mse": float((err ** 2).mean()), "mae": float(np.abs(err).mean()),
                              "r2": float(r2.mean()) if r2.size else 0.0}
    if r2.size > 1:
        report["r2_per_output"] = [float(v) for v in r2]
    return report


def predicted_classes(output: np.ndarray, task: str) -> np.ndarray:
    """Class indices from network outputs (probabilities or logits)."""
    if task == "binary":
        return (output.reshape(-1) > 0.5).astype(np.int64)
    return output.argmax(axis=1)
