"""BatchNorm: train-mode gradients (dense and NCHW), running statistics, eval mode, saved with the model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from magmadnn_cli.core.graph import nn
from magmadnn_cli.core.graph import Variable
from magmadnn_cli.nn.layers import BatchNorm, Dense
from magmadnn_cli.nn.losses import MeanSquaredError
from magmadnn_cli.inference import restore
from magmadnn_cli.training.modelfile import load
from magmadnn_cli.nn.network import Network

from conftest import check_op_grads, run_cli

rng = np.random.default_rng(11)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("shape", [(6, 4), (3, 4, 3, 2)])
def test_train_mode_gradients(shape):
    mode = nn.Mode()
    mode.training = True
    x, gamma, beta = rng.normal(size=shape) * 2 + 1, rng.normal(size=4), rng.normal(size=4)
    check_op_grads(lambda a, g, b: nn.BatchNorm(a, g, b, np.zeros(4), np.ones(4), mode), x, gamma, beta)


@pytest.mark.usefixtures("float64")
def test_statistics_train_and_eval():
    mode = nn.Mode()
    mode.training = True
    x = rng.normal(size=(50, 3)) * np.array([1.0, 2.0, 3.0]) + np.array([5.0, -1.0, 0.0])
    mean, var = np.zeros(3), np.ones(3)
    op = nn.BatchNorm(Variable("x", x), Variable("g", np.ones(3)), Variable("b", np.zeros(3)), mean, var, mode,
                      momentum=0.9)
    y = op.forward(x, np.ones(3), np.zeros(3))
    np.testing.assert_allclose(y.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(y.std(axis=0), 1, atol=1e-4)
    np.testing.assert_allclose(mean, 0.1 * x.mean(axis=0))
    np.testing.assert_allclose(var, 0.9 + 0.1 * x.var(axis=0, ddof=1))
    mode.training = False
    y_eval = op.forward(x, np.ones(3), np.zeros(3))
    np.testing.assert_allclose(y_eval, (x - mean) / np.sqrt(var + 1e-5))


def test_batchnorm_layer_state_is_saved_and_restored(capsys, tmp_path, blobs):
    cfg = blobs.read_text().replace("    - {type: dense, units: 3,", "    - {type: batchnorm}\n    - {type: dense, units: 3,")
    blobs.write_text(cfg)
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "r", "-q")
    assert code == 0, err
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["validation"]["accuracy"] >= 0.95
    saved = load(tmp_path / "r" / "model.npz")
    assert {"batchnorm_1/gamma", "batchnorm_1/beta", "batchnorm_1/running_mean", "batchnorm_1/running_var"} <= set(saved.weights)
    assert not np.allclose(saved.weights["batchnorm_1/running_mean"], 0)
    net = restore(saved)
    np.testing.assert_array_equal(net.state_dict()["batchnorm_1/running_var"], saved.weights["batchnorm_1/running_var"])


def test_batchnorm_after_dense_in_a_network_uses_running_stats_in_eval():
    net = Network([Dense.of(units=4), BatchNorm.of()], (3,), MeanSquaredError(), seed=0)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    net.forward_backward(x, np.zeros((8, 4), np.float32))
    a, b = net.predict(x[:1]), net.predict(x[:1])  # eval: one row, deterministic, no batch statistics
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(a))
