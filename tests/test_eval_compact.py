"""A classifier's evaluation keeps one compact class index a row (issue 48: the final report over a
streamed 10 GB table's 50 million training rows ran out of its 3 GiB address space with two int64
copies of every row's class): predictions and class targets stay in the smallest unsigned type, and
the report's counts are taken a chunk at a time. The numbers are those of a direct count."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from magmadnn_cli.data import metrics
from magmadnn_cli.data.prepare import Split
from magmadnn_cli.training.evaluation import split_report

ROWS = 2_000_000


class Logits:
    """A stand-in network whose outputs are its inputs (each row's logits)."""
    output_shape = (3,)

    def loss_and_output(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        return 0.5, x


@pytest.mark.parametrize("task, width", [("classification", 3), ("binary", 1)])
def test_the_report_holds_no_int64_copy_of_the_rows_and_counts_right(monkeypatch, task, width):
    monkeypatch.setattr(metrics, "SUMS_ROWS", 1 << 16)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, width)).astype(np.float32)
    y = rng.integers(0, max(2, width), ROWS).astype(np.uint8)  # as a streamed run keeps class targets
    network = Logits()
    network.output_shape = (width,)
    split = Split(x if task == "classification" else 1 / (1 + np.exp(-x)), y if task == "classification"
                  else y.astype(np.float32).reshape(-1, 1))
    tracemalloc.start()
    try:
        report = split_report(network, split, ["a", "b", "c"][:max(2, width)], task, batch_size=1 << 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ROWS * 8  # less than one int64 a row, all copies together
    predicted = x.argmax(axis=1) if task == "classification" else (x.reshape(-1) > 0).astype(int)
    assert report["accuracy"] == pytest.approx(float((predicted == y).mean()), abs=1e-12)
    confusion = np.zeros((max(2, width),) * 2, int)
    np.add.at(confusion, (y, predicted), 1)
    assert report["confusion_matrix"] == confusion.tolist()


@pytest.mark.parametrize("task, width, per_row", [("classification", 3, 2), ("classification", 300, 3),
                                                  ("multilabel", 300, 301), ("regression", 2, 8)])
def test_the_memory_check_counts_what_a_row_keeps(monkeypatch, task, width, per_row):
    """Checked before the first batch: a row's prediction as kept (a class index, or a label set's
    L flags) and its finite flag, or its outputs; twice (kept, then gathered)."""
    from magmadnn_cli.core import backend as B
    from magmadnn_cli.data.targets import target_task
    from magmadnn_cli.training import evaluation
    asked: list[int] = []
    monkeypatch.setattr(B, "require_memory", lambda nbytes, *a, **k: asked.append(nbytes))
    network = Logits()
    network.output_shape, network.activation_size = (width,), 0
    evaluation._check_memory(network, 1_000, 0, not target_task(task).decl.labels, target_task(task))
    assert asked == [2 * 1_000 * per_row]
