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
    return {
        "accuracy": float(tp.sum() / max(1, cm.sum())),
        "macro_f1": float(f1.mean()),
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


def regression_report(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    err = y_pred.astype(np.float64) - y_true.astype(np.float64)
    total = ((y_true - y_true.mean(axis=0)) ** 2).sum()
    return {"mse": float((err ** 2).mean()), "mae": float(np.abs(err).mean()),
            "r2": float(1 - (err ** 2).sum() / total) if total > 0 else 0.0}


def predicted_classes(output: np.ndarray, task: str) -> np.ndarray:
    """Class indices from network outputs (probabilities or logits)."""
    if task == "binary":
        return (output.reshape(-1) > 0.5).astype(np.int64)
    return output.argmax(axis=1)
