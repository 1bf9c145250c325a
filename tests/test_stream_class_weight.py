"""training.class_weight while streaming (issue 48, item 3: class weights hold when streaming): the
weights are those of the training rows the hash rule keeps, counted from the file independently here,
and the loss uses them (a weighted run ends elsewhere than an unweighted one)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from conftest import run_cli
from magmadnn_cli.data import stream
from magmadnn_cli.training import builder
from test_stream_train import _columns, _config, _weights, _write, small_blocks  # noqa: F401  (a fixture)


@pytest.mark.usefixtures("small_blocks")
def test_balanced_class_weights_are_the_training_rows_and_weigh_the_loss(tmp_path, capsys, monkeypatch):
    data = _write(tmp_path, "csv")
    plain = _config(tmp_path, data)
    config = yaml.safe_load(open(plain))
    config["training"]["class_weight"] = "balanced"
    weighted = tmp_path / "weighted.yaml"
    weighted.write_text(yaml.safe_dump(config))
    seen = []
    real = builder.class_weights
    monkeypatch.setattr(builder, "class_weights", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    code, out, err = run_cli(capsys, "train", weighted, "--out", tmp_path / "weighted")
    assert code == 0, out + err
    labels = _columns()["label"]  # the file's rows, in order
    codes = stream.split_codes(np.arange(len(labels)), config["seed"], config["data"]["validation_split"],
                               config["data"]["test_split"])
    train = labels[codes == stream.TRAIN]
    counts = np.array([np.sum(train == "no"), np.sum(train == "yes")])  # classes sorted: no, yes
    np.testing.assert_allclose(seen[0], len(train) / (2 * counts), rtol=1e-12)
    assert abs(seen[0][0] - seen[0][1]) > 0.01  # (the file's classes are not balanced: the weights matter)
    code, out, err = run_cli(capsys, "train", plain, "--out", tmp_path / "plain")
    assert code == 0, out + err
    one, two = _weights(tmp_path / "weighted"), _weights(tmp_path / "plain")
    assert any(not np.array_equal(one[k], two[k]) for k in one)
