"""Each optimizer's first three steps against its published rule written out by hand; clipping,
weight decay, and the learning-rate schedules against their formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from magmadnn_cli.nn import schedules
from magmadnn_cli.nn.optimizers import OPTIMIZERS, SGD, Adagrad, Adam, AdamW, RMSprop

P0 = np.array([1.0, -2.0, 0.5])
GRADS = [np.array([0.1, -0.3, 0.2]), np.array([-0.2, 0.1, 0.4]), np.array([0.05, 0.05, -0.1])]

pytestmark = pytest.mark.usefixtures("float64")


def run(opt, steps=3):
    p = P0.copy()
    out = []
    for g in GRADS[:steps]:
        opt.step(p, g.copy())
        out.append(p.copy())
    return out


def assert_steps(opt, expected):
    for got, want in zip(run(opt), expected):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_sgd_plain():
    lr = 0.1
    p1 = P0 - lr * GRADS[0]
    p2 = p1 - lr * GRADS[1]
    p3 = p2 - lr * GRADS[2]
    assert_steps(SGD(learning_rate=lr), [p1, p2, p3])


def test_sgd_momentum_and_nesterov():
    lr, mu = 0.1, 0.9
    v1 = GRADS[0]
    v2 = mu * v1 + GRADS[1]
    v3 = mu * v2 + GRADS[2]
    p1 = P0 - lr * v1
    p2 = p1 - lr * v2
    p3 = p2 - lr * v3
    assert_steps(SGD(learning_rate=lr, momentum=mu), [p1, p2, p3])
    n1 = P0 - lr * (GRADS[0] + mu * v1)
    n2 = n1 - lr * (GRADS[1] + mu * v2)
    n3 = n2 - lr * (GRADS[2] + mu * v3)
    assert_steps(SGD(learning_rate=lr, momentum=mu, nesterov=True), [n1, n2, n3])


def _adam_reference(lr, b1, b2, eps, wd=0.0, decoupled=False):
    p, m, v, out = P0.copy(), np.zeros(3), np.zeros(3), []
    for t, g in enumerate(GRADS, start=1):
        if decoupled:
            p = p - lr * wd * p
        else:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g ** 2
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        out.append(p.copy())
    return out


def test_adam():
    assert_steps(Adam(learning_rate=0.01), _adam_reference(0.01, 0.9, 0.999, 1e-8))
    assert_steps(Adam(learning_rate=0.01, weight_decay=0.1), _adam_reference(0.01, 0.9, 0.999, 1e-8, wd=0.1))


def test_adamw_decouples_weight_decay():
    expected = _adam_reference(0.01, 0.9, 0.99, 1e-8, wd=0.1, decoupled=True)
    assert_steps(AdamW(learning_rate=0.01, beta2=0.99, weight_decay=0.1), expected)
    assert not np.allclose(expected[-1], _adam_reference(0.01, 0.9, 0.99, 1e-8, wd=0.1)[-1])


def test_adagrad():
    lr, eps = 0.1, 1e-8
    p, acc, out = P0.copy(), np.zeros(3), []
    for g in GRADS:
        acc = acc + g * g
        p = p - lr * g / (np.sqrt(acc) + eps)
        out.append(p)
    assert_steps(Adagrad(learning_rate=lr), out)


def test_rmsprop():
    lr, rho, eps = 0.01, 0.9, 1e-8
    p, s, out = P0.copy(), np.zeros(3), []
    for g in GRADS:
        s = rho * s + (1 - rho) * g * g
        p = p - lr * g / (np.sqrt(s) + eps)
        out.append(p)
    assert_steps(RMSprop(learning_rate=lr), out)


def test_l2_weight_decay_is_added_to_the_gradient():
    lr, wd = 0.1, 0.01
    p1 = P0 - lr * (GRADS[0] + wd * P0)
    p2 = p1 - lr * (GRADS[1] + wd * p1)
    p3 = p2 - lr * (GRADS[2] + wd * p2)
    assert_steps(SGD(learning_rate=lr, weight_decay=wd), [p1, p2, p3])


def test_clip_by_global_norm():
    opt = SGD(learning_rate=1.0, clip_norm=0.1)
    p, g = np.zeros(2), np.array([3.0, 4.0])  # norm 5 -> scaled to 0.1
    opt.step(p, g.copy())
    np.testing.assert_allclose(p, -np.array([0.06, 0.08]))
    p, g = np.zeros(2), np.array([0.03, 0.04])  # norm 0.05: untouched
    opt.step(p, g.copy())
    np.testing.assert_allclose(p, -g)


def test_custom_optimizer_is_one_update_rule():
    class SignSGD(SGD):
        name = "signsgd"

        def update(self, p, g, lr, state):
            p -= lr * np.sign(g)

    out = run(SignSGD(learning_rate=0.5), steps=1)[0]
    np.testing.assert_allclose(out, P0 - 0.5 * np.sign(GRADS[0]))
    assert set(OPTIMIZERS) == {"sgd", "adam", "adamw", "adagrad", "rmsprop"}


def test_schedules_follow_their_formulas():
    assert schedules.constant(0.1)(7.3) == 0.1
    step = schedules.step(0.1, step_size=2, gamma=0.5)
    assert [step(t) for t in (0, 1.9, 2, 4.5)] == pytest.approx([0.1, 0.1, 0.05, 0.025])
    exp = schedules.exponential(0.1, gamma=0.5, decay_epochs=2)
    assert exp(3) == pytest.approx(0.1 * 0.5 ** 1.5)
    cos = schedules.cosine(0.1, epochs=10, min_lr=0.01)
    assert cos(0) == pytest.approx(0.1)
    assert cos(5) == pytest.approx(0.01 + 0.09 * 0.5)
    assert cos(10) == pytest.approx(0.01) and cos(20) == pytest.approx(0.01)
    assert cos(2.5) == pytest.approx(0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi / 4)))
    warm = schedules.warmup(schedules.constant(0.2), warmup_epochs=2)
    assert [warm(t) for t in (0, 1, 2, 3)] == pytest.approx([0.0, 0.1, 0.2, 0.2])


def test_optimizer_uses_schedule_per_step_in_epochs():
    opt = SGD(learning_rate=1.0, schedule=schedules.step(1.0, step_size=1, gamma=0.5), steps_per_epoch=2)
    p = np.zeros(1)
    lrs = []
    for _ in range(5):
        lrs.append(opt.lr())
        opt.step(p, np.ones(1))
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25]
    np.testing.assert_allclose(p, -sum(lrs))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blas_axpby_is_one_fused_pass_of_the_formula(dtype):
    from magmadnn_cli.core import blas
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=1000).astype(dtype), rng.normal(size=1000).astype(dtype)
    expected = -0.05 * x.astype(np.float64) + 0.999 * y.astype(np.float64)
    if not blas.axpby(-0.05, x, 0.999, y):
        pytest.skip("this numpy build ships no OpenBLAS axpby")
    np.testing.assert_allclose(y, expected, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-7)
    assert not blas.axpby(1.0, x[::2], 1.0, y[::2])          # strided: refused, numpy does it
    assert not blas.axpby(1.0, x.astype(np.int32), 1.0, y)   # mixed types: refused
