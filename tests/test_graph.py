"""Finite-difference gradient checks for every op (float64), fan-out, broadcasting, minimize."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.core import graph as G
from magmadnn_cli.core.graph import ACTIVATIONS, Graph, Variable, get_activation, nn, ops, unbroadcast
from magmadnn_cli.nn.optimizers import SGD, minimize

from conftest import check_op_grads

rng = np.random.default_rng(42)
A = rng.normal(size=(3, 4))
Bm = rng.normal(size=(3, 4))
POS = rng.uniform(0.5, 2.0, size=(3, 4))

pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize("build,arrays", [
    (lambda a, b: a + b, (A, Bm)),
    (lambda a, b: a - b, (A, Bm)),
    (lambda a, b: a * b, (A, Bm)),
    (lambda a, b: a / b, (A, POS)),
    (lambda a: -a, (A,)),
    (lambda a, b: a @ b, (A, rng.normal(size=(4, 5)))),
    (lambda a: a ** 3, (A,)),
    (lambda a: a ** 0.5, (POS,)),
    (lambda a: G.exp(a), (A,)),
    (lambda a: G.log(a), (POS,)),
    (lambda a: G.sum(a), (A,)),
    (lambda a: G.sum(a, axis=0), (A,)),
    (lambda a: G.sum(a, axis=1, keepdims=True), (A,)),
    (lambda a: G.mean(a), (A,)),
    (lambda a: G.mean(a, axis=(0,)), (A,)),
    (lambda a: G.mean(a, axis=-1, keepdims=True), (A,)),
    (lambda a: ops.Reshape(a, (4, 3)), (A,)),
    (lambda a: ops.Transpose(a), (A,)),
    (lambda a: ops.Transpose(a, (2, 0, 1)), (rng.normal(size=(2, 3, 4)),)),
    (lambda a: ops.Flatten(a), (rng.normal(size=(2, 3, 4)),)),
], ids=["add", "sub", "mul", "div", "neg", "matmul", "pow3", "sqrt", "exp", "log", "sum", "sum0",
        "sum1k", "mean", "mean0", "mean-1k", "reshape", "transpose", "transpose3", "flatten"])
def test_op_gradients(build, arrays):
    check_op_grads(build, *arrays)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradients(name):
    x = rng.normal(size=(4, 5)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # keep away from relu's kink
    check_op_grads(lambda a: G.activation(a, name), x)


@pytest.mark.parametrize("shape_a,shape_b", [((3, 4), (4,)), ((3, 4), (1, 4)), ((3, 1), (1, 4)),
                                             ((2, 3, 4), (3, 1)), ((3, 4), ())])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_broadcast_gradients(shape_a, shape_b, op):
    a, b = rng.normal(size=shape_a), rng.uniform(0.5, 2, size=shape_b)
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y,
          "mul": lambda x, y: x * y, "div": lambda x, y: x / y}[op]
    check_op_grads(fn, a, b)


def test_fan_out_of_three_and_more_accumulates():
    # x feeds five consumers; MagmaDNN's graph broke at three.
    check_op_grads(lambda x: x * x + G.exp(x) + x * 3.0 - x / 2.0 + x ** 2, A)
    x = Variable("x", np.array(2.0), requires_grad=True)
    y = x + x + x + x
    g = Graph(y)
    g.forward()
    g.backward()
    assert float(x.grad) == 4.0


def test_log_is_guarded_at_zero():
    x = Variable("x", np.array([0.0, -1.0, 1.0]), requires_grad=True)
    out = G.log(x)
    g = Graph(G.sum(out))
    g.forward()
    assert np.all(np.isfinite(out.value))
    g.backward()
    np.testing.assert_allclose(x.grad, [0.0, 0.0, 1.0])


def test_dense_op_gradients_with_and_without_bias():
    x, w, b = rng.normal(size=(5, 4)), rng.normal(size=(4, 3)), rng.normal(size=(3,))
    for act in ("linear", "sigmoid", "tanh", "softmax", "gelu"):
        check_op_grads(lambda x_, w_, b_: nn.Dense(x_, w_, b_, get_activation(act)), x, w, b)
    check_op_grads(lambda x_, w_: nn.Dense(x_, w_, None, get_activation("relu")), x, w)


def _loss_grad_check(op_cls, pred, target, **kw):
    check_op_grads(lambda p: op_cls(p, Variable("y", target), **kw), pred)


def test_loss_gradients():
    z = rng.normal(size=(6, 4)) * 3
    labels = np.array([0, 3, 1, 2, 2, 0])
    _loss_grad_check(nn.SoftmaxCrossEntropy, z, labels)
    _loss_grad_check(nn.SoftmaxCrossEntropy, z, np.eye(4)[labels])
    logits = rng.normal(size=(6, 1)) * 3
    y01 = rng.integers(0, 2, size=(6, 1)).astype(float)
    _loss_grad_check(nn.BinaryCrossEntropy, logits, y01, from_logits=True)
    _loss_grad_check(nn.BinaryCrossEntropy, rng.uniform(0.05, 0.95, size=(6, 1)), y01, from_logits=False)
    _loss_grad_check(nn.MeanSquaredError, z, rng.normal(size=z.shape))
    _loss_grad_check(nn.MeanAbsoluteError, z, z + rng.choice([-1, 1], size=z.shape) * rng.uniform(0.1, 1, z.shape))


def test_softmax_cross_entropy_gradient_is_p_minus_y_over_n_and_stable():
    z = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]])
    zv = Variable("z", z, requires_grad=True)
    loss = nn.SoftmaxCrossEntropy(zv, Variable("y", np.array([0, 2])))
    g = Graph(loss)
    (value,) = g.forward()
    assert np.isfinite(value)
    np.testing.assert_allclose(value, (0.0 + np.log(3)) / 2)
    g.backward()
    p = np.array([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(zv.grad, (p - np.eye(3)[[0, 2]]) / 2, atol=1e-12)


def test_binary_cross_entropy_from_logits_is_stable():
    z = Variable("z", np.array([[800.0], [-800.0]]), requires_grad=True)
    loss = nn.BinaryCrossEntropy(z, Variable("y", np.array([[1.0], [0.0]])))
    g = Graph(loss)
    assert float(g.forward()[0]) == pytest.approx(0.0, abs=1e-12)


def test_unbroadcast_restores_shape():
    g = np.ones((2, 3, 4))
    assert unbroadcast(g, (3, 1)).shape == (3, 1)
    np.testing.assert_allclose(unbroadcast(g, (3, 1)), np.full((3, 1), 8.0))
    np.testing.assert_allclose(unbroadcast(g, ()), 24.0)


def test_minimize_quadratic_converges_to_three():
    x = Variable("x", np.array(0.0), requires_grad=True)
    c = Variable("c", np.array(5.0))
    expr = (x - 3.0) ** 2 + c
    final = minimize(Graph(expr), SGD.of(learning_rate=0.1), steps=200, wrt=[x])
    assert float(x.value) == pytest.approx(3.0, abs=1e-6)
    assert final == pytest.approx(5.0, abs=1e-6)
