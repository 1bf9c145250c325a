"""Evaluation in batches that fit (issue 44, item 9): a target of 10,000 classes is scored batch by
batch, each row's scores reduced to its class as it comes, so the run trains and evaluates under a
3 GiB address-space cap (it was refused: every row's 10,000 scores, twice, would need 1.5 GiB)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import numpy as np

from conftest import ROOT

GiB = 1 << 30
CONFIG = """\
name: many
seed: 0
device: cpu
data: {{train: many.csv, target: label, validation_split: {validation}, stratify: false}}
model: {{layers: [{{type: dense, units: {classes}, activation: softmax}}]}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.05}}
training: {{epochs: 1, batch_size: 512, checkpoint: false}}
"""


def _many_classes(folder, classes: int, rows: int, validation: float = 0.1):
    labels = np.arange(rows) % classes
    r = np.random.default_rng(0)
    x = np.stack([labels % 100, labels // 100, r.normal(size=rows), r.normal(size=rows)], axis=1)
    lines = ["f1,f2,f3,f4,label"] + [f"{a:.0f},{b:.0f},{c:.3f},{d:.3f},c{y}" for (a, b, c, d), y in zip(x, labels)]
    (folder / "many.csv").write_text("\n".join(lines) + "\n")
    (folder / "c.yaml").write_text(CONFIG.format(classes=classes, validation=validation))
    return folder / "c.yaml"


def test_ten_thousand_classes_train_and_evaluate_under_a_3_gib_cap(tmp_path):
    config = _many_classes(tmp_path, classes=10_000, rows=22_000)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * GiB, 3 * GiB))
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(tmp_path / "run"),
                           "-q"], cwd=tmp_path, preexec_fn=limit, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train"]["confusion_summary"]["classes"] == 10_000 and 0 <= metrics["train"]["accuracy"] <= 1


def test_batched_scores_agree_with_scoring_every_row_at_once(capsys, tmp_path):
    """The metrics of 40 classes, from per-batch classes, are those of the whole outputs."""
    from magmadnn_cli.data.prepare import Split
    from magmadnn_cli.nn.layers import Dense
    from magmadnn_cli.nn.losses import CrossEntropy
    from magmadnn_cli.nn.network import Network
    from magmadnn_cli.training import evaluation
    from magmadnn_cli.data.metrics import classification_report
    r = np.random.default_rng(0)
    net = Network([Dense.of(units=40, activation="softmax")], (4,), CrossEntropy(), seed=0)
    split = Split(r.normal(size=(3000, 4)).astype(np.float32), r.integers(0, 40, (3000, 1)))
    report = evaluation.split_report(net, split, [f"c{i}" for i in range(40)], "classification", batch_size=128)
    whole = net.predict(split.x)
    expected = classification_report(split.y.ravel(), whole.argmax(axis=1), [f"c{i}" for i in range(40)])
    assert report["accuracy"] == expected["accuracy"] and report["confusion_matrix"] == expected["confusion_matrix"]
    assert report["macro_f1"] == expected["macro_f1"]
