"""The three components added as one declaration plus their math each (layer_norm, adamax, huber):
their definitions against hand computations and finite differences, and each trained through the CLI,
saved, loaded and predicted."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from magmadnn_cli.config.losses import HuberLoss
from magmadnn_cli.config.optimizers import AdamaxOptimizer
from magmadnn_cli.core.graph import Graph, Variable
from magmadnn_cli.nn.layers import Conv2D, Dense, LayerNorm, LayerNormOp
from magmadnn_cli.nn.losses import Huber, HuberNode, MeanSquaredError
from magmadnn_cli.nn.network import Network
from magmadnn_cli.nn.optimizers import Adamax
from magmadnn_cli.inference import restore
from magmadnn_cli.training.modelfile import load

from conftest import ROOT, check_op_grads, project, run_cli

rng = np.random.default_rng(7)


# -- layer_norm ----------------------------------------------------------------------------------
@pytest.mark.usefixtures("float64")
def test_layer_norm_normalizes_each_sample_over_all_its_values_by_hand():
    x = np.array([[1.0, 2.0, 3.0, 6.0], [-1.0, -1.0, 1.0, 1.0]])
    gamma, beta = np.array([1.0, 2.0, 0.5, -1.0]), np.array([0.0, 0.1, 0.2, 0.3])
    op = LayerNormOp(Variable("x", x), Variable("g", gamma), Variable("b", beta), epsilon=1e-5)
    (y,) = Graph(op).forward()
    # row 0: mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5; row 1: mean 0, variance 1
    expected = np.array([[-2, -1, 0, 3], [-1, -1, 1, 1]]) / np.sqrt(np.array([[3.5], [1.0]]) + 1e-5) * gamma + beta
    np.testing.assert_allclose(y, expected, rtol=1e-12)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("shape", [(5, 4), (3, 2, 3, 3)])
def test_layer_norm_gradients_match_finite_differences(shape):
    sample = shape[1:]
    check_op_grads(lambda x, g, b: LayerNormOp(x, g, b, epsilon=1e-3), rng.normal(size=shape) * 3 + 1,
                   rng.normal(size=sample), rng.normal(size=sample), rtol=1e-5, atol=1e-8)


def test_layer_norm_after_a_convolution_learns_gamma_and_beta_of_the_sample_shape():
    net = Network([Conv2D.of(filters=2, kernel_size=3), LayerNorm.of(name="ln")], (1, 5, 5), MeanSquaredError())
    weights = net.state_dict()
    assert weights["ln/gamma"].shape == (2, 3, 3) and weights["ln/beta"].shape == (2, 3, 3)
    assert np.all(weights["ln/gamma"] == 1) and np.all(weights["ln/beta"] == 0)
    out = net.predict(rng.normal(size=(4, 1, 5, 5)).astype(np.float32))
    per_sample = out.reshape(4, -1)
    np.testing.assert_allclose(per_sample.mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(per_sample.var(axis=1), 1, atol=1e-3)


def test_layer_norm_epsilon_is_declared_once_with_its_default_and_range():
    assert LayerNorm.of().spec.epsilon == 1e-5
    with pytest.raises(Exception, match="epsilon"):
        LayerNorm.of(epsilon=0)


# -- adamax --------------------------------------------------------------------------------------
@pytest.mark.usefixtures("float64")
def test_adamax_takes_torchs_update_by_hand():
    lr, b1, b2, eps, wd = 0.002, 0.9, 0.999, 1e-8, 0.1
    opt = Adamax.of(weight_decay=wd)
    assert (opt.learning_rate, opt.beta1, opt.beta2, opt.epsilon) == (lr, b1, b2, eps)  # the declared defaults
    p = np.array([1.0, -2.0, 0.5])
    grads = [np.array([0.1, -0.3, 0.2]), np.array([-0.2, 0.1, 0.4]), np.array([0.05, 0.05, -0.1])]
    m, u, expected = np.zeros(3), np.zeros(3), p.copy()
    for t, g in enumerate(grads, start=1):
        g = g + wd * expected
        m = b1 * m + (1 - b1) * g
        u = np.maximum(b2 * u, np.abs(g) + eps)
        expected = expected - lr / (1 - b1 ** t) * m / u
        opt.step(p, grads[t - 1].copy())
        np.testing.assert_allclose(p, expected, rtol=1e-13)
    assert set(opt.state) == {"m", "u"}


def test_adamax_trains_the_blobs_through_the_cli_and_resumes_exactly(capsys, tmp_path):
    config = project(tmp_path)
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "r", "-q", "--set",
                           "optimizer={type: adamax, learning_rate: 0.02}")
    assert code == 0, err
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["validation"]["accuracy"] >= 0.95
    assert load(tmp_path / "r" / "model.npz").config.optimizer.type == "adamax"


# -- huber ---------------------------------------------------------------------------------------
@pytest.mark.usefixtures("float64")
def test_huber_is_the_mean_of_its_two_pieces_by_hand():
    p, y = np.array([[-2.0, -0.5], [0.3, 1.5]]), np.zeros((2, 2))
    node = HuberNode(Variable("p", p, requires_grad=True), Variable("y", y), delta=1.0)
    graph = Graph(node)
    (value,) = graph.forward()
    assert float(value) == pytest.approx((1.5 + 0.125 + 0.045 + 1.0) / 4, rel=1e-14)
    graph.backward()
    np.testing.assert_allclose(node.inputs[0].grad, np.array([[-1.0, -0.5], [0.3, 1.0]]) / 4, rtol=1e-14)
    wide = HuberNode(Variable("p", p), Variable("y", y), delta=2.5)
    assert float(Graph(wide).forward()[0]) == pytest.approx((2.0 + 0.125 + 0.045 + 1.125) / 4, rel=1e-14)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("delta", [0.5, 1.0, 3.0])
def test_huber_gradient_matches_finite_differences(delta):
    prediction = rng.normal(size=(6, 2)) * 2
    prediction[0, 0] = delta + 0.01  # near the joint, on both sides
    prediction[1, 1] = -delta + 0.01
    target = Variable("y", rng.normal(size=(6, 2)) * 0.1)
    check_op_grads(lambda p: HuberNode(p, target, delta), prediction + target.value, atol=1e-8)


def test_huber_delta_is_declared_once():
    assert Huber().spec.delta == 1.0 and Huber(HuberLoss.of(delta=2.0)).spec.delta == 2.0
    assert HuberLoss.task == "regression" and HuberLoss.fuses is None


@pytest.mark.slow
def test_huber_trains_the_diabetes_regression_and_predicts_from_the_file(capsys, tmp_path):
    config = ROOT / "configs" / "diabetes_regression.yaml"
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "r", "-q", "--set", "loss=huber",
                           "--set", "training.epochs=60")
    assert code == 0, err
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["test"]["r2"] > 0.3, metrics
    saved = load(tmp_path / "r" / "model.npz")
    assert saved.config.loss.type == "huber" and saved.config.loss.delta == 1.0
    code, _, err = run_cli(capsys, "predict", tmp_path / "r" / "model.npz", ROOT / "datasets" / "diabetes.csv",
                           "-o", tmp_path / "p.csv")
    assert code == 0, err
    with open(tmp_path / "p.csv") as f:
        assert len(list(csv.DictReader(f))) == 442


def test_a_model_with_layer_norm_saves_loads_and_predicts_the_same(capsys, tmp_path):
    config = project(tmp_path)
    layers = "[{type: dense, units: 16}, {type: layer_norm}, {type: activation, activation: relu}, " \
             "{type: dense, units: 3, activation: softmax}]"
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "r", "-q", "--set", f"model.layers={layers}")
    assert code == 0, err
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["validation"]["accuracy"] >= 0.95
    saved = load(tmp_path / "r" / "model.npz")
    assert saved.weights["layer_norm_1/gamma"].shape == (16,) and saved.weights["layer_norm_1/beta"].shape == (16,)
    assert not np.all(saved.weights["layer_norm_1/gamma"] == 1)  # it learned
    net = restore(saved)
    assert all(np.array_equal(v, saved.weights[k]) for k, v in net.state_dict().items())
    code, out, err = run_cli(capsys, "predict", tmp_path / "r" / "model.npz", tmp_path / "blobs.csv")
    assert code == 0, err
    assert out.count("\n") >= 120


def test_components_need_no_runtime_defaults():
    """The runtime reads every hyperparameter from the declaration (one owner of each default)."""
    assert Adamax(AdamaxOptimizer.of()).learning_rate == 0.002
    assert Dense.of(units=2).spec.kernel_initializer == "glorot_uniform"
