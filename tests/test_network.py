"""Layers, initializers and the Network: gradient checks through whole networks, dropout modes,
flat buffers, shape errors, and real learning (XOR, 3-class spiral)."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.errors import MagmaError, ShapeError
from magmadnn_cli.core.graph import Variable, nn
from magmadnn_cli.nn.initializers import INITIALIZERS, get_initializer
from magmadnn_cli.nn.layers import LAYERS, Activation, Dense, Dropout, Flatten, Input
from magmadnn_cli.nn.losses import LOSSES, BinaryCrossEntropy, CrossEntropy, MeanAbsoluteError, MeanSquaredError
from magmadnn_cli.nn.network import Network
from magmadnn_cli.nn.optimizers import SGD, Adam

from conftest import numerical_grad

rng = np.random.default_rng(7)


def _network_grad_check(net: Network, x: np.ndarray, y: np.ndarray) -> None:
    net.forward_backward(x, y)
    analytic = net.flat_grads.copy()

    def f() -> float:
        net.mode.training = True
        return float(net.train_graph.forward({net.x: x, net.y: y})[0])

    numeric = numerical_grad(f, net.flat_params)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("loss,out_units,out_act,target", [
    (CrossEntropy, 3, "softmax", lambda: rng.integers(0, 3, size=6)),
    (BinaryCrossEntropy, 1, "sigmoid", lambda: rng.integers(0, 2, size=(6, 1)).astype(float)),
    (MeanSquaredError, 2, "linear", lambda: rng.normal(size=(6, 2))),
    (MeanAbsoluteError, 2, "tanh", lambda: rng.normal(size=(6, 2))),
])
def test_network_gradients_match_finite_differences(loss, out_units, out_act, target):
    layers = [Input.of(shape=(2, 3)), Flatten.of(), Dense.of(units=5, activation="tanh"), Activation.of(activation="leaky_relu", alpha=0.1),
              Dense.of(units=4, activation="gelu", name="hidden2"), Dropout.of(rate=0.0), Dense.of(units=out_units, activation=out_act, name="out")]
    net = Network(layers, (2, 3), loss(), seed=3)
    _network_grad_check(net, rng.normal(size=(6, 2, 3)), target())


@pytest.mark.usefixtures("float64")
def test_separate_softmax_layer_is_fused_with_cross_entropy():
    net = Network([Dense.of(units=4, activation="relu"), Dense.of(units=3), Activation.of(activation="softmax")], (2,), CrossEntropy(), seed=1)
    assert net.logits is not net.output
    x, y = rng.normal(size=(5, 2)), rng.integers(0, 3, size=5)
    _network_grad_check(net, x, y)
    np.testing.assert_allclose(net.predict(x).sum(axis=1), 1.0)


def test_parameters_are_views_of_one_flat_buffer():
    net = Network([Dense.of(units=4, activation="relu"), Dense.of(units=2)], (3,), MeanSquaredError())
    assert net.num_parameters == 3 * 4 + 4 + 4 * 2 + 2
    net.flat_params[:] = 0.5
    assert all(np.all(p.value == 0.5) for p in net.parameters)
    net.forward_backward(np.ones((2, 3), np.float32), np.zeros((2, 2), np.float32))
    assert all(np.shares_memory(p.grad, net.flat_grads) for p in net.parameters)
    assert net.flat_params.dtype == np.float32
    assert [p.name for p in net.parameters] == ["dense/kernel", "dense/bias", "dense/kernel", "dense/bias"]


def test_bias_has_units_shape_independent_of_batch():
    net = Network([Dense.of(units=7)], (3,), MeanSquaredError())
    bias = net.layers[0].weights["bias"]
    assert bias.value.shape == (7,)
    for batch in (1, 5):
        net.forward_backward(np.ones((batch, 3), np.float32), np.zeros((batch, 7), np.float32))
        assert bias.grad.shape == (7,)


def test_dropout_is_inverted_in_training_and_identity_in_eval():
    net = Network([Dropout.of(rate=0.5)], (1000,), MeanSquaredError(), seed=0)
    x = np.ones((20, 1000), np.float32)
    np.testing.assert_array_equal(net.predict(x), x)  # eval mode: untouched
    net.forward_backward(x, x)
    (dropout,) = [n for n in net.train_graph.ops if isinstance(n, nn.Dropout)]
    train_out = dropout.value
    kept = train_out != 0
    assert 0.45 < kept.mean() < 0.55
    np.testing.assert_allclose(train_out[kept], 2.0)
    np.testing.assert_array_equal(net.predict(x), x)


@pytest.mark.parametrize("name", ["glorot_uniform", "glorot_normal", "he_uniform", "he_normal"])
def test_initializers_scale_with_fan_in_and_out(name):
    fan_in, fan_out = 400, 100
    w = get_initializer(name)(np.random.default_rng(0), (fan_in, fan_out), fan_in, fan_out)
    expected_var = {"glorot_uniform": 2 / (fan_in + fan_out), "glorot_normal": 2 / (fan_in + fan_out),
                    "he_uniform": 2 / fan_in, "he_normal": 2 / fan_in}[name]
    assert w.var() == pytest.approx(expected_var, rel=0.05)
    assert abs(w.mean()) < 0.01


def test_simple_initializers_and_bad_names():
    r = np.random.default_rng(0)
    assert np.all(get_initializer("zeros")(r, (2, 2), 2, 2) == 0)
    assert np.all(get_initializer("ones")(r, (2, 2), 2, 2) == 1)
    assert np.all(get_initializer({"type": "constant", "value": 0.3})(r, (2,), 1, 1) == 0.3)
    assert np.abs(get_initializer({"type": "uniform", "limit": 0.1})(r, (1000,), 1, 1)).max() <= 0.1
    assert get_initializer({"type": "normal", "stddev": 2.0})(r, (20000,), 1, 1).std() == pytest.approx(2.0, rel=0.05)
    assert {"xavier_uniform", "he_normal"} <= set(INITIALIZERS)
    with pytest.raises(MagmaError, match="unknown initializer 'glorot'"):
        get_initializer("glorot")


def test_shape_errors_name_the_layer_and_shapes():
    with pytest.raises(ShapeError, match=r"layer 'hidden' \(dense\): expected flat input.*\(2, 3\)"):
        Network([Dense.of(units=4, name="hidden")], (2, 3), MeanSquaredError())
    net = Network([Dense.of(units=4)], (3,), MeanSquaredError())
    with pytest.raises(ShapeError, match=r"expects samples of shape \(3,\); received a batch of shape \(2, 5\)"):
        net.predict(np.ones((2, 5), np.float32))
    with pytest.raises(MagmaError, match="dense: units: Input should be greater than 0; received units=0"):
        Dense.of(units=0)
    with pytest.raises(MagmaError, match="activation: Input should be 'linear', 'sigmoid'.*received units=3, activation='sigmod'"):
        Dense.of(units=3, activation="sigmod")
    with pytest.raises(MagmaError, match=r"dropout: rate: Input should be less than 1; received rate=1.5"):
        Dropout.of(rate=1.5)


def test_load_state_checks_names_and_shapes():
    net = Network([Dense.of(units=4), Dense.of(units=2, name="out")], (3,), MeanSquaredError(), seed=1)
    other = Network([Dense.of(units=4), Dense.of(units=2, name="out")], (3,), MeanSquaredError(), seed=2)
    other.load_state_dict(net.state_dict())
    np.testing.assert_array_equal(other.flat_params, net.flat_params)
    bad = dict(net.state_dict(), **{"out/kernel": np.zeros((5, 2))})
    with pytest.raises(ShapeError, match=r"out/kernel.*expected shape \(4, 2\); received \(5, 2\)"):
        other.load_state_dict(bad)


def test_registries_use_the_config_tags():
    shipped = {tag for tag, cls in LAYERS.items() if cls.__module__.startswith("magmadnn_cli")}
    assert shipped == {"input", "dense", "activation", "dropout", "flatten", "conv2d", "pool2d", "batchnorm",
                       "global_avg_pool", "reshape", "residual", "layer_norm"}
    assert set(LOSSES) == {"cross_entropy", "binary_cross_entropy", "mse", "mae", "huber"}


def _train(net, opt, x, y, steps):
    for _ in range(steps):
        net.forward_backward(x, y)
        opt.step(net.flat_params, net.flat_grads)


def test_learns_xor():
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
    y = np.array([[0], [1], [1], [0]], np.float32)
    net = Network([Dense.of(units=8, activation="tanh"), Dense.of(units=1, activation="sigmoid")], (2,), BinaryCrossEntropy(), seed=0)
    _train(net, SGD.of(learning_rate=0.5, momentum=0.9), x, y, 300)
    assert np.array_equal(net.predict(x) > 0.5, y > 0.5)


def spiral(n_per_class: int = 100, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    xs, ys = [], []
    for k in range(classes):
        radius = np.linspace(0.05, 1, n_per_class)
        theta = np.linspace(k * 4, (k + 1) * 4, n_per_class) + r.normal(0, 0.2, n_per_class)
        xs.append(np.c_[radius * np.sin(theta), radius * np.cos(theta)])
        ys.append(np.full(n_per_class, k))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def test_learns_three_class_spiral():
    x, y = spiral()
    net = Network([Dense.of(units=64, activation="relu", kernel_initializer="he_normal"), Dense.of(units=64, activation="relu"),
                   Dense.of(units=3, activation="softmax")], (2,), CrossEntropy(), seed=0)
    _train(net, Adam.of(learning_rate=0.01), x, y, 400)
    assert (net.predict(x).argmax(axis=1) == y).mean() >= 0.95
    xt, yt = spiral(seed=1)  # a fresh draw of the same distribution
    assert (net.predict(xt).argmax(axis=1) == yt).mean() >= 0.9


def test_dropout_mask_of_a_row_depends_only_on_its_position_and_the_key():
    """What makes N ranks draw what one process draws: any subset of rows gets the same masks."""
    x = Variable("x", np.ones((10, 300), dtype=np.float32))
    mode = nn.Mode()
    mode.training = True
    drop = nn.Dropout(x, 0.25, mode, stream=1)
    mode.set_batch(key=42, positions=np.arange(10))
    whole = drop.forward(x.value)
    mode.set_batch(key=42, positions=np.arange(5, 10))
    np.testing.assert_array_equal(drop.forward(x.value[5:]), whole[5:])
    mode.set_batch(key=43, positions=np.arange(10))
    assert not np.array_equal(drop.forward(x.value), whole)  # another epoch's key: other masks
    kept = whole != 0
    assert abs(kept.mean() - 0.75) < 0.02 and np.allclose(whole[kept], 1 / 0.75)
    other_stream = nn.Dropout(x, 0.25, mode, stream=2)
    mode.set_batch(key=42, positions=np.arange(10))
    assert not np.array_equal(other_stream.forward(x.value), whole)  # each dropout layer its own draws


def test_counter_random_bits_are_uniform_and_uncorrelated():
    from magmadnn_cli.core.counter_random import bits32
    u = bits32(7, np.arange(2000), 500).astype(np.float64) / 2**32
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.005   # neighbours in a row
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.005         # neighbouring rows
    counts = np.histogram(u, bins=16, range=(0, 1))[0]
    assert counts.min() > 0.97 * u.size / 16 and counts.max() < 1.03 * u.size / 16
