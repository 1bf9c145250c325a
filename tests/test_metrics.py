"""Metrics against hand computations (scikit-learn's conventions)."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.data.metrics import classification_report, regression_report


def test_macro_f1_averages_the_classes_that_occur():
    # 4 labels, class "d" neither true nor predicted anywhere in this split
    y_true = np.array([0, 0, 1, 1, 2, 2])
    y_pred = np.array([0, 1, 1, 1, 2, 0])
    report = classification_report(y_true, y_pred, ["a", "b", "c", "d"])
    # a: p 1/2 r 1/2 f 1/2; b: p 2/3 r 1 f 4/5; c: p 1 r 1/2 f 2/3 -> mean over a, b, c
    assert report["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert report["per_class"]["d"]["support"] == 0
    # a class that is predicted but never true counts (its F1 is 0), as in scikit-learn
    report = classification_report(np.array([0, 0, 1]), np.array([0, 2, 1]), ["a", "b", "c"])
    assert report["macro_f1"] == pytest.approx((2 / 3 + 1 + 0) / 3)


def test_r2_per_output_and_their_mean():
    y = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    pred = np.array([[1.0, 14.0], [2.0, 16.0], [3.0, 34.0], [4.0, 36.0]])
    report = regression_report(y, pred)
    # column 1 is exact (R2 1); column 2: SSE 4*16 = 64, SST 500 -> 1 - 64/500
    assert report["r2_per_output"] == pytest.approx([1.0, 1 - 64 / 500])
    assert report["r2"] == pytest.approx((1.0 + 1 - 64 / 500) / 2)
    assert report["mse"] == pytest.approx(64 / 8) and report["mae"] == pytest.approx(16 / 8)
    single = regression_report(y[:, :1], pred[:, 1:] / 10)
    assert "r2_per_output" not in single
