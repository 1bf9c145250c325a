"""Convolution and pooling: forward against a direct loop reference, float64 finite-difference
gradients (stride, padding, dilation, overlapping windows), layer shapes, and a CNN from the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from magmadnn_cli.errors import MagmaError, ShapeError
from magmadnn_cli.core.graph import Variable
from magmadnn_cli.core.graph.conv import Conv2D, Pool2D
from magmadnn_cli.nn.layers import Conv2D as Conv2DLayer, Dense, Flatten, Pool2D as Pool2DLayer
from magmadnn_cli.nn.losses import CrossEntropy
from magmadnn_cli.nn.network import Network

from conftest import ROOT, check_op_grads, run_cli

rng = np.random.default_rng(3)
X = rng.normal(size=(2, 3, 7, 6))
W = rng.normal(size=(4, 3, 3, 2))
Bias = rng.normal(size=4)

pytestmark = pytest.mark.usefixtures("float64")


def reference_conv(x, w, b, stride, pad, dilation):
    """The definition, one output element at a time."""
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n, c, h, wd = xp.shape
    f, _, kh, kw = w.shape
    ho, wo = (h - dh * (kh - 1) - 1) // sh + 1, (wd - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, f, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
            y[:, :, i, j] = np.einsum("nchw,fchw->nf", patch, w) + b
    return y


def reference_pool(x, mode, k, s, p):
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    ho, wo = (xp.shape[2] - k[0]) // s[0] + 1, (xp.shape[3] - k[1]) // s[1] + 1
    y = np.zeros(x.shape[:2] + (ho, wo))
    for i in range(ho):
        for j in range(wo):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            y[:, :, i, j] = win.max(axis=(2, 3)) if mode == "max" else win.mean(axis=(2, 3))
    return y


CONV_CASES = [((1, 1), (0, 0), (1, 1)), ((2, 1), (1, 1), (1, 1)), ((1, 2), (2, 1), (2, 2))]
POOL_CASES = [((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1)), ((3, 2), (2, 1), (1, 0))]


@pytest.mark.parametrize("stride,pad,dilation", CONV_CASES)
def test_conv_forward_matches_definition_and_gradients_match_finite_differences(stride, pad, dilation):
    op = Conv2D(Variable("x", X), Variable("w", W), Variable("b", Bias), stride, pad, dilation)
    np.testing.assert_allclose(op.forward(X, W, Bias), reference_conv(X, W, Bias, stride, pad, dilation), atol=1e-12)
    check_op_grads(lambda x, w, b: Conv2D(x, w, b, stride, pad, dilation), X, W, Bias)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("kernel,stride,pad", POOL_CASES)
def test_pool_forward_and_gradients(mode, kernel, stride, pad):
    op = Pool2D(Variable("x", X), mode, kernel, stride, pad)
    np.testing.assert_allclose(op.forward(X), reference_pool(X, mode, kernel, stride, pad), atol=1e-12)
    check_op_grads(lambda x: Pool2D(x, mode, kernel, stride, pad), X)


def test_cnn_layers_shapes_and_gradients_through_a_network():
    layers = [Conv2DLayer.of(filters=4, kernel_size=3, padding="same", activation="tanh"), Pool2DLayer.of(mode="max", pool_size=2),
              Conv2DLayer.of(filters=5, kernel_size=(2, 2), stride=1, activation="relu"), Pool2DLayer.of(mode="avg", pool_size=2, stride=1),
              Flatten.of(), Dense.of(units=3, activation="softmax")]
    net = Network(layers, (2, 8, 8), CrossEntropy(), seed=0)
    assert [layer.output_shape for layer in layers] == [(4, 8, 8), (4, 4, 4), (5, 3, 3), (5, 2, 2), (20,), (3,)]
    x, y = rng.normal(size=(3, 2, 8, 8)), rng.integers(0, 3, size=3)
    from test_network import _network_grad_check
    _network_grad_check(net, x, y)


def test_conv_layer_errors():
    with pytest.raises(ShapeError, match=r"expected \(channels, height, width\) input; received \(64,\)"):
        Network([Conv2DLayer.of(filters=4)], (64,), CrossEntropy())
    with pytest.raises(MagmaError, match="padding 'same' needs stride 1"):
        Network([Conv2DLayer.of(filters=4, kernel_size=2, padding="same")], (1, 8, 8), CrossEntropy())
    with pytest.raises(ShapeError, match="does not fit input"):
        Network([Conv2DLayer.of(filters=4, kernel_size=9)], (1, 8, 8), CrossEntropy())


@pytest.mark.slow
def test_digits_cnn_from_the_cli(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", "--out", tmp_path / "r", "-q")
    assert code == 0, err
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["test"]["accuracy"] >= 0.97
    code, out, _ = run_cli(capsys, "predict", tmp_path / "r" / "model.npz", ROOT / "datasets" / "digits.csv.gz")
    assert code == 0 and len(out.splitlines()) == 1798


def test_data_shape_must_fit_the_columns(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", "--out", tmp_path / "r",
                           "--set", "data.shape=[1, 9, 8]")
    assert code == 2 and "data.shape: [1, 9, 8] holds 72 values per sample" in err


def test_residual_block_gradients_and_shape_rule():
    from magmadnn_cli.nn.layers import GlobalAvgPool, Residual
    conv = {"type": "conv2d", "filters": 2, "kernel_size": 3, "padding": "same"}
    block = Residual.of(layers=[{**conv, "activation": "tanh"}, {"type": "batchnorm"}, conv], activation="tanh",
                        name="res")
    layers = [block, GlobalAvgPool.of(), Dense.of(units=3, activation="softmax")]
    net = Network(layers, (2, 5, 5), CrossEntropy(), seed=1)
    assert [p.name for p in net.parameters][:2] == ["res.conv2d_0/kernel", "res.conv2d_0/bias"]
    from test_network import _network_grad_check
    _network_grad_check(net, rng.normal(size=(4, 2, 5, 5)), rng.integers(0, 3, size=4))
    with pytest.raises(ShapeError, match=r"a residual block must keep the shape"):
        Network([Residual.of(layers=[{**conv, "filters": 3}])], (2, 5, 5), CrossEntropy())


def test_resnet_config_trains_and_round_trips(capsys, tmp_path):
    from magmadnn_cli.inference import restore
    from magmadnn_cli.training.modelfile import load
    code, _, err = run_cli(capsys, "train", ROOT / "configs" / "resnet_small.yaml", "--out", tmp_path / "r", "-q",
                           "--set", "training.epochs=2")
    assert code == 0, err
    saved = load(tmp_path / "r" / "model.npz")
    assert "residual_3.conv2d_0/kernel" in saved.weights and "residual_3.batchnorm_1/running_var" in saved.weights
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["validation"]["accuracy"] > 0.5
    net = restore(saved)
    assert all(np.array_equal(v, saved.weights[k]) for k, v in net.state_dict().items())


def test_max_pool_routes_a_tied_window_to_its_first_largest_input():
    """After a ReLU many windows are all zeros: the gradient must go to one input (the first, as in
    PyTorch), not to every tied one."""
    x = np.zeros((1, 1, 4, 4))
    x[0, 0, 2:, 2:] = [[1.0, 3.0], [3.0, 2.0]]
    op = Pool2D(Variable("x", x), "max", (2, 2), (2, 2), (0, 0))
    op.value = op.forward(x)
    (dx,) = op.backward(np.ones((1, 1, 2, 2)))
    expected = np.zeros((4, 4))
    expected[0, 0] = expected[0, 2] = expected[2, 0] = 1.0  # all-zero windows: their first element
    expected[2, 3] = 1.0                                     # 3 twice: the first in row-major order
    np.testing.assert_array_equal(dx[0, 0], expected)
