"""Every convolution algorithm (gemm, Winograd F(2x2, 3x3), FFT) against the direct definition in
float64, forward and backward (finite differences), over the padding / stride / dilation cases each
supports; layers an algorithm cannot run fall back to gemm; autotuning keeps the fastest."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

from magmadnn_cli.core import blas
from magmadnn_cli.core.graph import Graph, Variable, get_activation, ops
from magmadnn_cli.core.graph.conv import Conv2D, Pool2D
from magmadnn_cli.core.graph.convolution import ALGORITHMS, Geometry, MARGIN, candidates, fastest
from magmadnn_cli.core.graph.convolution.geometry import SMALL_GEMM, matmul_wide
from magmadnn_cli.core.graph.nn import Activate
from magmadnn_cli.nn.layers import Pool2D as Pool2DLayer
from magmadnn_cli.training.modelfile import load

from conftest import ROOT, check_op_grads, run_cli
from test_conv import reference_conv

pytestmark = pytest.mark.usefixtures("float64")
rng = np.random.default_rng(11)

# (x shape, w shape, stride, pad, dilation)
CASES = {
    "3x3 valid, odd map": ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (0, 0), (1, 1)),
    "3x3 same": ((2, 2, 6, 5), (3, 2, 3, 3), (1, 1), (1, 1), (1, 1)),
    "3x3 asymmetric padding": ((1, 2, 5, 8), (2, 2, 3, 3), (1, 1), (2, 0), (1, 1)),
    "5x5 same": ((2, 1, 9, 9), (3, 1, 5, 5), (1, 1), (2, 2), (1, 1)),
    "3x2 kernel, dilated": ((2, 2, 8, 7), (2, 2, 3, 2), (1, 1), (1, 2), (2, 3)),
    "strided": ((2, 3, 9, 8), (4, 3, 3, 3), (2, 1), (1, 1), (1, 1)),
    "1x1": ((2, 4, 4, 3), (5, 4, 1, 1), (1, 1), (0, 0), (1, 1)),
}
SUPPORTED = {"gemm": set(CASES), "fft": set(CASES) - {"strided"},
             "winograd": {"3x3 valid, odd map", "3x3 same", "3x3 asymmetric padding"}}


def arrays(case: str):
    xs, ws, stride, pad, dilation = CASES[case]
    return rng.normal(size=xs), rng.normal(size=ws), rng.normal(size=ws[0]), stride, pad, dilation


def test_each_algorithm_supports_exactly_its_geometries():
    for case, (_, ws, stride, pad, dilation) in CASES.items():
        geometry = Geometry(ws[2:], stride, pad, dilation)
        assert set(candidates(geometry)) == {name for name, cases in SUPPORTED.items() if case in cases}, case


@pytest.mark.parametrize("name,case", [(n, c) for n in ALGORITHMS for c in CASES if c in SUPPORTED[n]])
def test_forward_matches_the_definition_and_gradients_match_finite_differences(name, case):
    x, w, b, stride, pad, dilation = arrays(case)
    op = Conv2D(Variable("x", x), Variable("w", w), Variable("b", b), stride, pad, dilation, algorithm=name)
    assert op.effective_algorithm(w) == name
    np.testing.assert_allclose(op.forward(x, w, b), reference_conv(x, w, b, stride, pad, dilation), atol=1e-11)
    check_op_grads(lambda xv, wv, bv: Conv2D(xv, wv, bv, stride, pad, dilation, algorithm=name), x, w, b)


@pytest.mark.parametrize("name", ["winograd", "fft"])
def test_an_algorithm_that_cannot_run_a_layer_falls_back_to_gemm(name):
    x, w, b, stride, pad, dilation = arrays("strided")
    op = Conv2D(Variable("x", x), Variable("w", w), Variable("b", b), stride, pad, dilation, algorithm=name)
    assert op.effective_algorithm(w) == "gemm"
    np.testing.assert_allclose(Graph(op).forward()[0], reference_conv(x, w, b, stride, pad, dilation), atol=1e-11)


def test_all_algorithms_give_the_same_gradients_in_a_chain():
    """Two convolutions in a row (the second reads the first's channel-major output view) and a
    weighted sum: every algorithm gives gemm's gradients for input, kernels and biases."""
    x = rng.normal(size=(3, 2, 8, 8))
    w1, w2 = rng.normal(size=(4, 2, 3, 3)), rng.normal(size=(3, 4, 3, 3))
    b1, b2 = rng.normal(size=4), rng.normal(size=3)
    weights = rng.normal(size=(3, 3, 8, 8))
    grads = {}
    for name in ALGORITHMS:
        xs = [Variable(n, v, requires_grad=True) for n, v in (("x", x), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))]
        h = Conv2D(xs[0], xs[1], xs[2], (1, 1), (1, 1), (1, 1), algorithm=name)
        y = Conv2D(h, xs[3], xs[4], (1, 1), (1, 1), (1, 1), algorithm=name)
        graph = Graph(ops.Sum(ops.Mul(y, Variable("weights", weights))))
        graph.forward()
        graph.backward()
        grads[name] = [v.grad for v in xs]
    for name in ("winograd", "fft"):
        for got, want in zip(grads[name], grads["gemm"]):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.fixture
def pieces(monkeypatch):
    """The column counts of the GEMMs `matmul_wide` runs piece by piece (np.matmul with out=)."""
    calls, matmul = [], np.matmul

    def spy(x, y, out=None, **kwargs):
        if out is not None:
            calls.append(y.shape[1])
        return matmul(x, y, out=out, **kwargs)
    monkeypatch.setattr(np, "matmul", spy)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_wide_product_cut_into_pieces_equals_the_whole_product(dtype, pieces):
    """6 x 25 times 25 x 20011: pieces of SMALL_GEMM / 150 columns (a ragged last one), on any
    number of BLAS threads (fewer than 8 rows); shapes whose pieces would be short run as one GEMM."""
    a, b = rng.normal(size=(6, 25)).astype(dtype), rng.normal(size=(25, 20011)).astype(dtype)
    got = matmul_wide(a, b)
    piece = SMALL_GEMM // 150 // 16 * 16
    assert pieces == [piece] * (20011 // piece) + [20011 % piece] and got.dtype == dtype
    want = np.einsum("mk,kn->mn", a.astype(np.float64), b)
    np.testing.assert_allclose(got, want, atol=1e-4 if dtype == np.float32 else 1e-12)
    pieces.clear()
    matmul_wide(rng.normal(size=(64, 150)), rng.normal(size=(150, 30000)))
    assert pieces == []  # 64 x 150: a piece would have 96 columns


@pytest.mark.parametrize("threads,cut", [(1, True), (4, False)])
def test_eight_rows_or_more_are_cut_only_on_one_blas_thread(threads, cut, pieces, monkeypatch):
    """16 x 9 times 9 x 20000: pieces of 6,944 columns on one thread (a rank's); one threaded GEMM
    on more. The same product either way."""
    monkeypatch.setattr(blas, "get_threads", lambda: threads)
    a, b = rng.normal(size=(16, 9)), rng.normal(size=(9, 20000))
    np.testing.assert_allclose(matmul_wide(a, b), np.einsum("mk,kn->mn", a, b), atol=1e-12)
    assert pieces == ([6944, 6944, 20000 - 2 * 6944] if cut else [])


def test_a_wide_layer_gives_the_same_values_and_gradients_in_pieces(pieces, monkeypatch):
    """A 2 -> 3 channel 3x3 layer on 24 maps of 28 x 28, on one BLAS thread: its forward GEMM
    (3 x 18) and its input-gradient GEMM (18 x 3) run in two pieces each; FFT's results are the
    reference."""
    monkeypatch.setattr(blas, "get_threads", lambda: 1)
    x, w, b = rng.normal(size=(24, 2, 28, 28)), rng.normal(size=(3, 2, 3, 3)), rng.normal(size=3)
    g = rng.normal(size=(24, 3, 28, 28))
    results = {}
    for name in ("gemm", "fft"):
        algorithm = ALGORITHMS[name](Geometry((3, 3), (1, 1), (1, 1), (1, 1)))
        results[name] = (algorithm.forward(x, w, b), *algorithm.backward(g, w, True))
    piece = SMALL_GEMM // 54 // 16 * 16
    assert pieces == [piece, 24 * 28 * 30 - piece] * 2
    for got, want in zip(results["gemm"], results["fft"]):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(results["gemm"][0], reference_conv(x, w, b, (1, 1), (1, 1), (1, 1)), atol=1e-10)


def test_tuning_times_every_candidate_and_keeps_the_fastest():
    x, w, b, stride, pad, dilation = arrays("3x3 same")
    op = Conv2D(Variable("x", x), Variable("w", w), Variable("b", b), stride, pad, dilation, algorithm="auto")
    times = op.tune(x)
    assert set(times) == {"gemm", "winograd", "fft"} and all(t > 0 for t in times.values())
    assert op.algorithm == min(times, key=times.get)
    np.testing.assert_allclose(Graph(op).forward()[0], reference_conv(x, w, b, stride, pad, dilation), atol=1e-11)


def test_near_ties_keep_gemm_and_a_clear_win_takes_over():
    assert fastest({"gemm": 1.0, "winograd": 0.95}) == "gemm"
    assert fastest({"gemm": 1.0, "fft": 0.5, "winograd": 0.7}) == "fft"
    assert fastest({"gemm": 1.0}) == "gemm"


def test_max_pool_before_relu_gives_the_same_values_and_gradients():
    """The layers pool the pre-activation and apply relu after (relu commutes with max); values and
    gradients equal relu-then-pool's, also where windows tie (all-negative and equal inputs)."""
    x = rng.normal(size=(2, 3, 6, 6))
    x[0, 0, :2, :2] = -1.0          # an all-negative tied window
    x[1, 2, 2:4, 2:4] = 0.5         # a positive tie
    weights = rng.normal(size=(2, 3, 3, 3))
    grads, values = [], []
    for pool_first in (False, True):
        v = Variable("x", x.copy(), requires_grad=True)
        relu = get_activation("relu")
        out = (Activate(Pool2D(v, "max", (2, 2), (2, 2), (0, 0)), relu) if pool_first
               else Pool2D(Activate(v, relu), "max", (2, 2), (2, 2), (0, 0)))
        graph = Graph(ops.Sum(ops.Mul(out, Variable("w", weights))))
        values.append(graph.forward()[0])
        graph.backward()
        grads.append(v.grad)
    assert values[0] == values[1]
    np.testing.assert_array_equal(grads[0], grads[1])
    layer_out = Pool2DLayer.of(mode="max", pool_size=2)(Activate(Variable("x", x), get_activation("relu")), None)
    assert isinstance(layer_out, Activate) and isinstance(layer_out.inputs[0], Pool2D)
    tanh_out = Pool2DLayer.of(mode="max", pool_size=2)(Activate(Variable("x", x), get_activation("tanh")), None)
    assert isinstance(tanh_out, Pool2D)  # tanh saturates: ties would move, so no reordering


def test_training_times_the_fastest_layers_says_so_and_keeps_the_choice_when_resumed(capsys, tmp_path):
    out = tmp_path / "r"
    code, log, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", "--out", out, "--set",
                             "training.epochs=2", "--set", "model.layers.0.conv_algorithm=fft", "--set",
                             "model.layers.2.conv_algorithm=fastest", "--set", "training.checkpoint.every_epochs=1")
    assert code == 0, err
    log = re.search(r"convolutions: (.*)", log).group(1)
    assert log.startswith("conv2d_0 fft (set in the config); conv2d_2 ")
    timed = re.search(r"conv2d_2 (\w+) \(timed on 32 rows: (.*)\)", log)
    times = {a: float(ms) for a, ms in re.findall(r"(\w+) ([\d.]+) ms", timed.group(2))}
    assert set(times) == {"gemm", "winograd", "fft"}
    best = min(times, key=times.__getitem__)
    near_the_margin = abs(times[best] - MARGIN * times["gemm"]) <= 0.01  # the log rounds to 0.01 ms
    assert timed.group(1) == fastest(times) or (near_the_margin and timed.group(1) in (best, "gemm"))
    chosen = json.loads((out / "metrics.json").read_text())["conv_algorithms"]
    assert chosen == {"conv2d_0": "fft", "conv2d_2": timed.group(1)}
    code, log, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", "--resume", out, "--set",
                             "training.epochs=3", "--set", "model.layers.0.conv_algorithm=fft", "--set",
                             "model.layers.2.conv_algorithm=fastest")
    assert code == 0, err
    assert "convolutions:" not in log + err  # the checkpoint's choice, not a new timing
    assert json.loads((out / "metrics.json").read_text())["conv_algorithms"] == chosen


def test_summary_names_each_convolutions_algorithm(capsys):
    code, out, err = run_cli(capsys, "summary", ROOT / "configs" / "digits_cnn.yaml", "--set",
                             "model.layers.2.conv_algorithm=fft", "--set", "model.layers.0.kernel_size=5",
                             "--set", "model.layers.0.conv_algorithm=winograd")
    assert code == 0, err
    text = " ".join(out.split())
    assert "conv2d_0: gemm (winograd cannot run this layer)" in text and "conv2d_2: fft" in text
    code, out, _ = run_cli(capsys, "summary", ROOT / "configs" / "digits_cnn.yaml", "--set",
                           "model.layers.2.conv_algorithm=fastest")
    text = " ".join(out.split())
    assert "conv2d_0: gemm (auto: the fixed rule)" in text
    assert "conv2d_2: the fastest of gemm/winograd/fft, timed when training starts" in text


def test_a_forced_algorithm_that_cannot_run_the_layer_is_said_to_fall_back(capsys, tmp_path):
    code, log, err = run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", "--out", tmp_path / "r", "--set",
                             "training.epochs=1", "--set", "model.layers.0.kernel_size=5", "--set",
                             "model.layers.0.conv_algorithm=winograd", "--set", "model.layers.2.conv_algorithm=gemm")
    assert code == 0, err
    assert ("convolutions: conv2d_0 gemm (the config's winograd cannot run this layer); "
            "conv2d_2 gemm (set in the config)") in log


def test_a_network_without_convolutions_says_nothing_about_them(capsys, tmp_path):
    code, log, err = run_cli(capsys, "train", ROOT / "configs" / "iris.yaml", "--out", tmp_path / "r",
                             "--set", "training.epochs=1")
    assert code == 0, err
    assert "convolutions" not in log + err
    assert "conv_algorithms" not in json.loads((tmp_path / "r" / "metrics.json").read_text())


def test_the_written_config_pins_what_fastest_chose_so_it_repeats_the_run(capsys, tmp_path):
    """Autotuning (`fastest`) times the machine, so two runs of one config may choose differently; the
    run's config.yaml (and the model file's) records the algorithm each such layer ran, nested blocks
    included, and training it again runs the same ones without timing."""
    config = ROOT / "configs" / "resnet_small.yaml"
    fastest_everywhere = [f"--set=model.layers.{path}.conv_algorithm=fastest"
                          for path in ("0", "3.layers.0", "3.layers.3", "5.layers.0", "5.layers.1")]
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "a", "-q", "--set", "training.epochs=1",
                           *fastest_everywhere)
    assert code == 0, err
    chosen = json.loads((tmp_path / "a" / "metrics.json").read_text())["conv_algorithms"]
    written = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())

    def convs(layers):
        return [a for spec in layers for a in ([spec["conv_algorithm"]] if spec["type"] == "conv2d"
                                               else convs(spec.get("layers") or []))]
    assert convs(written["model"]["layers"]) == list(chosen.values()) and len(chosen) == 5
    assert convs(load(tmp_path / "a" / "model.npz").config.model_dump(mode="json")["model"]["layers"]) == list(chosen.values())
    code, log, err = run_cli(capsys, "train", tmp_path / "a" / "config.yaml", "--out", tmp_path / "b")
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["conv_algorithms"] == chosen
    assert "timed on" not in log  # every layer set in the config: nothing timed


def test_the_config_written_as_a_run_starts_names_the_algorithms_it_runs(capsys, tmp_path, monkeypatch):
    """config.yaml is resolved before the first step: a run stopped in its first epoch leaves a
    config that names each auto convolution's algorithm, as the finished run's does."""
    from magmadnn_cli.training.builder import Run
    seen = {}

    def fit(run, prune=None):
        seen["config"] = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
        seen["chosen"] = dict(run.trainer.conv_algorithms)
        raise KeyboardInterrupt  # stopped before its first step

    monkeypatch.setattr(Run, "fit", fit)
    run_cli(capsys, "train", ROOT / "configs" / "digits_cnn.yaml", "--out", tmp_path / "r")
    convolutions = [layer for layer in seen["config"]["model"]["layers"] if "conv_algorithm" in layer]
    assert [layer["conv_algorithm"] for layer in convolutions] == list(seen["chosen"].values())
    assert all(layer["conv_algorithm"] not in ("auto", "fastest") for layer in convolutions)
