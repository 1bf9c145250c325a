"""Each optimizer's first three steps against its published rule written out by hand; clipping,
weight decay, and the learning-rate schedules against their formulas."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from magmadnn_cli.config.optimizers import ConstantSchedule, CosineSchedule, ExponentialSchedule, StepSchedule
from magmadnn_cli.nn import optimizers
from magmadnn_cli.nn.optimizers import LAMB, LARS, OPTIMIZERS, SGD, Adagrad, Adam, AdamW, RMSprop

from conftest import BLOBS_CONFIG, blobs_csv, run_cli

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
    assert_steps(SGD.of(learning_rate=lr), [p1, p2, p3])


def test_sgd_momentum_and_nesterov():
    lr, mu = 0.1, 0.9
    v1 = GRADS[0]
    v2 = mu * v1 + GRADS[1]
    v3 = mu * v2 + GRADS[2]
    p1 = P0 - lr * v1
    p2 = p1 - lr * v2
    p3 = p2 - lr * v3
    assert_steps(SGD.of(learning_rate=lr, momentum=mu), [p1, p2, p3])
    n1 = P0 - lr * (GRADS[0] + mu * v1)
    n2 = n1 - lr * (GRADS[1] + mu * v2)
    n3 = n2 - lr * (GRADS[2] + mu * v3)
    assert_steps(SGD.of(learning_rate=lr, momentum=mu, nesterov=True), [n1, n2, n3])


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
    assert_steps(Adam.of(learning_rate=0.01), _adam_reference(0.01, 0.9, 0.999, 1e-8))
    assert_steps(Adam.of(learning_rate=0.01, weight_decay=0.1), _adam_reference(0.01, 0.9, 0.999, 1e-8, wd=0.1))


def test_adamw_decouples_weight_decay():
    expected = _adam_reference(0.01, 0.9, 0.99, 1e-8, wd=0.1, decoupled=True)
    assert_steps(AdamW.of(learning_rate=0.01, beta2=0.99, weight_decay=0.1), expected)
    assert not np.allclose(expected[-1], _adam_reference(0.01, 0.9, 0.99, 1e-8, wd=0.1)[-1])


def test_adagrad():
    lr, eps = 0.1, 1e-8
    p, acc, out = P0.copy(), np.zeros(3), []
    for g in GRADS:
        acc = acc + g * g
        p = p - lr * g / (np.sqrt(acc) + eps)
        out.append(p)
    assert_steps(Adagrad.of(learning_rate=lr), out)


def test_rmsprop():
    lr, rho, eps = 0.01, 0.9, 1e-8
    p, s, out = P0.copy(), np.zeros(3), []
    for g in GRADS:
        s = rho * s + (1 - rho) * g * g
        p = p - lr * g / (np.sqrt(s) + eps)
        out.append(p)
    assert_steps(RMSprop.of(learning_rate=lr), out)


def test_l2_weight_decay_is_added_to_the_gradient():
    lr, wd = 0.1, 0.01
    p1 = P0 - lr * (GRADS[0] + wd * P0)
    p2 = p1 - lr * (GRADS[1] + wd * p1)
    p3 = p2 - lr * (GRADS[2] + wd * p2)
    assert_steps(SGD.of(learning_rate=lr, weight_decay=wd), [p1, p2, p3])


def test_clip_by_global_norm():
    opt = SGD.of(learning_rate=1.0, clip_norm=0.1)
    p, g = np.zeros(2), np.array([3.0, 4.0])  # norm 5 -> scaled to 0.1
    opt.step(p, g.copy())
    np.testing.assert_allclose(p, -np.array([0.06, 0.08]))
    p, g = np.zeros(2), np.array([0.03, 0.04])  # norm 0.05: untouched
    opt.step(p, g.copy())
    np.testing.assert_allclose(p, -g)


def test_custom_optimizer_is_one_update_rule():
    class SignSGD(SGD):
        def update(self, p, g, lr, state):
            p -= lr * np.sign(g)

    out = run(SignSGD.of(learning_rate=0.5), steps=1)[0]
    np.testing.assert_allclose(out, P0 - 0.5 * np.sign(GRADS[0]))
    assert set(OPTIMIZERS) == {"sgd", "adam", "adamw", "adagrad", "rmsprop", "lars", "lamb", "adamax"}


def test_schedules_follow_their_formulas():
    assert ConstantSchedule.of().rate(0.1, 7.3, 10) == 0.1
    step = StepSchedule.of(step_size=2, gamma=0.5)
    assert [step.rate(0.1, t, 10) for t in (0, 1.9, 2, 4.5)] == pytest.approx([0.1, 0.1, 0.05, 0.025])
    assert ExponentialSchedule.of(gamma=0.5, decay_epochs=2).rate(0.1, 3, 10) == pytest.approx(0.1 * 0.5 ** 1.5)
    cos = CosineSchedule.of(epochs=10, min_lr=0.01)
    assert cos.rate(0.1, 0, 99) == pytest.approx(0.1)
    assert cos.rate(0.1, 5, 99) == pytest.approx(0.01 + 0.09 * 0.5)
    assert cos.rate(0.1, 10, 99) == pytest.approx(0.01) and cos.rate(0.1, 20, 99) == pytest.approx(0.01)
    assert cos.rate(0.1, 2.5, 99) == pytest.approx(0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi / 4)))
    run_length = CosineSchedule.of(min_lr=0.0)  # epochs: the run's (training.epochs)
    assert run_length.rate(0.1, 2, 4) == pytest.approx(0.05)
    warm = ConstantSchedule.of(warmup_epochs=2)
    assert [warm.rate(0.2, t, 10) for t in (0, 1, 2, 3)] == pytest.approx([0.0, 0.1, 0.2, 0.2])


def test_optimizer_uses_schedule_per_step_in_epochs():
    opt = SGD.of(learning_rate=1.0, schedule={"type": "step", "step_size": 1, "gamma": 0.5}, steps_per_epoch=2)
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


# -- layer-wise rules: LARS and LAMB against the papers' algorithms, one layer at a time ----------
SHAPES = [(5, 4), (4,), (4, 3), (3,), (6,)]


def _layers(shapes=SHAPES, steps=4, seed=0):
    """Per-tensor weights (the biases start at 0: ||w|| = 0) and gradients for `steps` steps; the
    third tensor's gradient is 0 at step 2 and the last one's always (trust ratio 1)."""
    rng = np.random.default_rng(seed)
    ws = [np.zeros(s) if s in ((4,), (3,)) else rng.normal(size=s) for s in shapes]
    grads = [[rng.normal(size=s) for s in shapes] for _ in range(steps)]
    grads[1][2][...] = 0.0
    for step in grads:
        step[-1][...] = 0.0
    return ws, grads


def _flat(arrays):
    return np.concatenate([a.ravel() for a in arrays])


def _unflat(flat, like):
    offsets = np.cumsum([0] + [w.size for w in like])
    return [flat[a:b].reshape(w.shape) for a, b, w in zip(offsets, offsets[1:], like)]


def _run_flat(opt, ws, grads, segments=True):
    if segments:
        opt.set_segments([w.shape for w in ws])
    p = _flat(ws)
    for step in grads:
        opt.step(p, _flat(step))
    return _unflat(p, ws)


def _lars_reference(ws, grads, lr, momentum, eta, wd, eps=0.0, exclude=False):
    """You, Gitman & Ginsburg 2017, Algorithm 1 with eq. 6's trust coefficient, layer by layer."""
    ws, vs = [w.copy() for w in ws], [np.zeros_like(w) for w in ws]
    for step in grads:
        for i, g in enumerate(step):
            w = ws[i]
            skip = exclude and w.ndim <= 1
            beta = 0.0 if skip else wd
            wn, gn = np.linalg.norm(w), np.linalg.norm(g)
            local = eta * wn / (gn + beta * wn + eps) if wn > 0 and gn > 0 and not skip else 1.0
            vs[i] = momentum * vs[i] + lr * local * (g + beta * w)
            ws[i] = w - vs[i]
    return ws


def _lamb_reference(ws, grads, lr, b1, b2, eps, wd, exclude=False):
    """You et al. 2019, Algorithm 2 with phi = identity, layer by layer."""
    ws = [w.copy() for w in ws]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    for t, step in enumerate(grads, start=1):
        for i, g in enumerate(step):
            w = ws[i]
            skip = exclude and w.ndim <= 1
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            r = (ms[i] / (1 - b1 ** t)) / (np.sqrt(vs[i] / (1 - b2 ** t)) + eps) + (0.0 if skip else wd) * w
            wn, rn = np.linalg.norm(w), np.linalg.norm(r)
            ratio = wn / rn if wn > 0 and rn > 0 and not skip else 1.0
            ws[i] = w - lr * ratio * r
    return ws


def _assert_layers(got, want, rtol=1e-12):
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-14, err_msg=f"tensor {i} {b.shape}")


@pytest.mark.parametrize("momentum,eps,exclude", [(0.9, 0.0, False), (0.0, 1e-3, False), (0.9, 0.0, True)])
def test_lars_follows_the_paper_layer_by_layer(momentum, eps, exclude):
    ws, grads = _layers()
    want = _lars_reference(ws, grads, lr=2.0, momentum=momentum, eta=0.01, wd=0.05, eps=eps, exclude=exclude)
    got = _run_flat(LARS.of(learning_rate=2.0, momentum=momentum, trust_coefficient=0.01, weight_decay=0.05, epsilon=eps, exclude_bias_and_norm=exclude), ws, grads)
    _assert_layers(got, want)
    one_tensor = _lars_reference([_flat(ws)], [[_flat(step)] for step in grads], 2.0, momentum, 0.01, 0.05, eps)
    assert not np.allclose(_flat(got), one_tensor[0])  # the trust ratios are per tensor


@pytest.mark.parametrize("exclude", [False, True])
def test_lamb_follows_the_paper_layer_by_layer(exclude):
    ws, grads = _layers()
    want = _lamb_reference(ws, grads, lr=0.01, b1=0.9, b2=0.99, eps=1e-6, wd=0.1, exclude=exclude)
    got = _run_flat(LAMB.of(learning_rate=0.01, beta2=0.99, epsilon=1e-6, weight_decay=0.1, exclude_bias_and_norm=exclude), ws, grads)
    _assert_layers(got, want)


def test_without_segments_the_whole_buffer_is_one_tensor():
    ws, grads = _layers()
    whole = [_flat(ws)], [[_flat(step)] for step in grads]
    got = _run_flat(LARS.of(learning_rate=2.0, trust_coefficient=0.01, weight_decay=0.05), ws, grads, segments=False)
    _assert_layers([_flat(got)], _lars_reference(*whole, lr=2.0, momentum=0.9, eta=0.01, wd=0.05))
    got = _run_flat(LAMB.of(learning_rate=0.01, weight_decay=0.01), ws, grads, segments=False)
    _assert_layers([_flat(got)], _lamb_reference(*whole, lr=0.01, b1=0.9, b2=0.999, eps=1e-6, wd=0.01))


def test_segments_must_cover_the_buffer():
    opt = LARS.of()
    opt.set_segments([(3, 2), (2,)])
    with pytest.raises(ValueError, match="tensors of 8 elements in all, but the update was given elements 0 to 9"):
        opt.step(np.ones(9), np.ones(9))


LAYERWISE = {
    "lars": lambda: LARS.of(learning_rate=2.0, trust_coefficient=0.01, weight_decay=0.05),
    "lars-plain": lambda: LARS.of(learning_rate=2.0, momentum=0.0, trust_coefficient=0.01),
    "lamb": lambda: LAMB.of(learning_rate=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("name", LAYERWISE)
def test_chunked_update_equals_the_whole_buffer_update(name, monkeypatch):
    shapes = [(300, 250), (250,), (250, 100), (100,), (7,)]
    ws, grads = _layers(shapes, steps=3)
    assert sum(w.size for w in ws) > 65536 == optimizers.CPU_CHUNK  # tensor 0 spans two chunks
    chunked = _run_flat(LAYERWISE[name](), ws, grads)
    monkeypatch.setattr(optimizers, "CPU_CHUNK", 10 ** 9)
    _assert_layers(chunked, _run_flat(LAYERWISE[name](), ws, grads), rtol=1e-11)


@pytest.mark.parametrize("cut", [30, 45])  # through tensor 2; at the end (the second rank holds nothing)
@pytest.mark.parametrize("name", LAYERWISE)
def test_two_ranks_updating_one_slice_each_equal_one_update(name, cut):
    """The shared_memory strategy's update: each rank applies the rule to its slice of the buffers,
    and `total` adds the per-tensor partial norms over the ranks (an allreduce, here two threads)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    ws, grads = _layers()
    want = _run_flat(LAYERWISE[name](), ws, grads)
    opts = [LAYERWISE[name]() for _ in range(2)]
    shapes = [w.shape for w in ws]
    params = _flat(ws)
    slots = {k: np.zeros_like(params) for k in opts[0].slots}
    barrier, box = threading.Barrier(2, timeout=30), [None, None]

    def rank(r: int, part: slice) -> None:
        def total(partial):
            box[r] = partial.copy()
            barrier.wait()
            summed = box[0] + box[1]
            barrier.wait()
            return summed
        opts[r].set_segments(shapes)
        for step in grads:
            g = _flat(step)
            opts[r].apply(params[part], g[part], {k: v[part] for k, v in slots.items()}, start=part.start, total=total)
            barrier.wait()

    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(rank, 0, slice(0, cut)), pool.submit(rank, 1, slice(cut, params.size))]
        for run in runs:
            run.result()
    _assert_layers(_unflat(params, ws), want)


@pytest.mark.parametrize("name", LAYERWISE)
def test_layerwise_state_round_trips(name):
    ws, grads = _layers()
    shapes = [w.shape for w in ws]
    first = LAYERWISE[name]()
    first.set_segments(shapes)
    p = _flat(ws)
    for step in grads[:2]:
        first.step(p, _flat(step))
    state = first.state_dict()
    assert state["step"] == 2 and {f"slots/{k}" for k in first.slots} <= set(state)
    second = LAYERWISE[name]()
    second.set_segments(shapes)
    second.load_state_dict(state)
    q = p.copy()
    for step in grads[2:]:
        first.step(p, _flat(step))
        second.step(q, _flat(step))
    np.testing.assert_array_equal(q, p)


# -- through the CLI --------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["{type: lars, learning_rate: 1.0, weight_decay: 0.0001}",
                                       "{type: lamb, learning_rate: 0.01}"])
def test_layerwise_optimizers_train_the_blobs_from_a_config(optimizer, capsys, blobs, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", blobs, "--out", out, "-q", "--set", f"optimizer={optimizer}")
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["validation"]["accuracy"] >= 0.95 and metrics["train"]["accuracy"] >= 0.95


def test_a_run_tells_its_optimizer_the_parameter_tensors(blobs):
    from magmadnn_cli.commands.train import build
    from magmadnn_cli.config.loading import load_config
    from magmadnn_cli.distributed.comm import SingleProcess

    run = build(load_config(blobs, ["optimizer={type: lars}"]), SingleProcess())
    assert run.trainer.opt.shapes == [tuple(p.value.shape) for p in run.network.parameters] == [(4, 16), (16,), (16, 3), (3,)]


def test_resuming_lars_continues_exactly(capsys, blobs, tmp_path):
    lars = ("--set", "optimizer={type: lars, learning_rate: 1.0, weight_decay: 0.0001}")
    assert run_cli(capsys, "train", blobs, "--out", tmp_path / "straight", "-q", *lars, "--set", "training.epochs=4")[0] == 0
    assert run_cli(capsys, "train", blobs, "--out", tmp_path / "split", "-q", *lars, "--set", "training.epochs=2")[0] == 0
    code, _, err = run_cli(capsys, "train", blobs, "--resume", tmp_path / "split", "-q", *lars,
                           "--set", "training.epochs=4")
    assert code == 0, err
    with np.load(tmp_path / "straight" / "model.npz") as a, np.load(tmp_path / "split" / "model.npz") as b:
        weights = [k for k in a.files if k.startswith("weights/")]
        assert weights
        for key in weights:
            np.testing.assert_array_equal(b[key], a[key], err_msg=key)


def test_a_misspelt_lars_option_is_a_located_error(capsys, tmp_path):
    blobs_csv(tmp_path / "blobs.csv")
    path = tmp_path / "bad.yaml"
    path.write_text(BLOBS_CONFIG.replace("optimizer: {type: adam, learning_rate: 0.01}",
                                         "optimizer: {type: lars, trust_coeficient: 0.01}"))
    code, out, err = run_cli(capsys, "train", path, "--out", tmp_path / "run")
    text = " ".join(err.split())
    assert code == 2, err
    assert "optimizer.trust_coeficient: unknown key 'trust_coeficient'" in text and "did you mean 'trust_coefficient'?" in text
    assert "Traceback" not in err + out
