"""Every convolution algorithm (gemm, Winograd F(2x2, 3x3), FFT) against the direct definition in
float64, forward and backward (finite differences), over the padding / stride / dilation cases each
supports; layers an algorithm cannot run fall back to gemm; autotuning keeps the fastest."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.core.graph import Graph, Variable, ops
from magmadnn_cli.core.graph.conv import Conv2D
from magmadnn_cli.core.graph.convolution import ALGORITHMS, Geometry, candidates

from conftest import check_op_grads
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


def test_tuning_times_every_candidate_and_keeps_the_fastest():
    x, w, b, stride, pad, dilation = arrays("3x3 same")
    op = Conv2D(Variable("x", x), Variable("w", w), Variable("b", b), stride, pad, dilation, algorithm="auto")
    times = op.tune(x)
    assert set(times) == {"gemm", "winograd", "fft"} and all(t > 0 for t in times.values())
    assert op.algorithm == min(times, key=times.get)
    np.testing.assert_allclose(Graph(op).forward()[0], reference_conv(x, w, b, stride, pad, dilation), atol=1e-11)
