"""Early stopping and tracking while streaming (issue 48, item 3): a streamed run stops when its
validation loss stops improving, keeps its best epoch's weights, and its TensorBoard events are its
metrics.csv epoch by epoch."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

from conftest import run_cli
from test_stream_train import _config, _write, small_blocks  # noqa: F401  (a fixture)


@pytest.mark.usefixtures("small_blocks")
def test_a_streamed_run_stops_early_keeps_its_best_epoch_and_is_tracked(tmp_path, capsys):
    config = yaml.safe_load(open(_config(tmp_path, _write(tmp_path, "csv"))))
    config["training"].update(epochs=30, early_stopping={"monitor": "val_loss", "patience": 2, "min_delta": 0.02})
    config["tracking"] = {"tensorboard": True}
    path = tmp_path / "stop.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, err = run_cli(capsys, "train", path, "--out", tmp_path / "run")
    assert code == 0, out + err
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["val_loss"]) for r in rows]
    assert len(rows) < 30 and min(losses[-2:]) > min(losses) - 0.02  # stopped: its last 2 epochs gained < min_delta
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())["validation"]["loss"]
    kept = [i for i, loss in enumerate(losses) if loss == pytest.approx(final, rel=1e-5)]
    assert kept and kept[0] < len(losses) - 1  # an earlier (best) epoch's weights kept, not the last epoch's
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    folders = {p.parent for p in (tmp_path / "run").rglob("events.out.tfevents.*")}
    assert len(folders) == 1
    acc = ea.EventAccumulator(str(folders.pop()), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    logged = acc.Scalars("validation/loss")
    assert [e.step for e in logged] == [int(r["epoch"]) for r in rows]
    np.testing.assert_array_equal([e.value for e in logged], [float(np.float32(v)) for v in losses])
