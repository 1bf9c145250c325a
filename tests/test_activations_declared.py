"""Activations are declared once (`config/activations.py`: name, alpha, output range) and implemented once
(`core/graph/activations.py`: math, gradient, ONNX form); SiLU proves that a new one is its declaration,
its math and its tests: it trains, summarizes, predicts and exports."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import ROOT, check_op_grads, run_cli
from magmadnn_cli.config.activations import DECLARATIONS
from magmadnn_cli.config.layers import ALPHA_ACTIVATIONS, ActivationName
from magmadnn_cli.core.graph import ACTIVATIONS, get_activation, nn
from test_export import _export_and_compare


def test_every_declaration_has_one_implementation_and_the_config_takes_every_name():
    assert set(DECLARATIONS) == set(ACTIVATIONS)
    assert set(ActivationName.__args__) == set(DECLARATIONS)
    assert set(ALPHA_ACTIVATIONS) == {n for n, d in DECLARATIONS.items() if d.alpha is not None}
    for name in ALPHA_ACTIVATIONS:  # the classes' own default (direct calls) is the declared one
        assert ACTIVATIONS[name]().alpha == DECLARATIONS[name].alpha


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_outputs_stay_in_the_declared_range(name, float64):
    z = np.linspace(-30, 30, 6000).reshape(-1, 3)
    y = get_activation(name)(z.copy())
    low, high = DECLARATIONS[name].output_range()
    assert low - 1e-9 <= y.min() and y.max() <= high + 1e-9, (name, y.min(), y.max())


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_every_activations_gradient_matches_finite_differences(name, float64):
    """Derived from the registry: a new activation's gradient is checked without a test of its own."""
    x = np.random.default_rng(0).normal(size=(4, 5)) * 3
    check_op_grads(lambda v: nn.Activate(v, get_activation(name)), x)


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_every_activations_onnx_form_computes_what_it_does(name):
    """Derived from the registry: each activation's ONNX form, alone in a graph, run by onnxruntime,
    equals its own math (float32), over both signs and the saturated ends."""
    ort = pytest.importorskip("onnxruntime")
    from magmadnn_cli.training.onnx_graph import OPSET, Graph
    activation = get_activation(name)
    g = Graph()
    g.inputs.append(g.helper.make_tensor_value_info("z", g.onnx.TensorProto.FLOAT, ["N", 7]))
    g.output(activation.onnx(g, "z"), "y", g.onnx.TensorProto.FLOAT, ["N", 7])
    model = g.helper.make_model(g.helper.make_graph(g.nodes, name, g.inputs, g.outputs, g.constants),
                                opset_imports=[g.helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    z = np.concatenate([np.linspace(-12, 12, 49), [-40.0, 40.0, 0.0, 1e-3, -1e-3, 0.5, -0.5]]).reshape(-1, 7)
    z = z.astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"z": z})[0], activation(z.copy()), rtol=2e-5, atol=2e-6)


def test_silu_is_z_times_its_sigmoid_with_the_right_gradient(float64):
    z = np.linspace(-20, 20, 401)
    np.testing.assert_allclose(get_activation("silu")(z.copy()), z / (1 + np.exp(-z)), rtol=1e-12, atol=1e-15)
    x = np.random.default_rng(0).normal(size=(4, 5)) * 3
    check_op_grads(lambda v: nn.Activate(v, get_activation("silu")), x)


def test_silu_matches_pytorch():
    torch = pytest.importorskip("torch")
    z = np.linspace(-8, 8, 97)
    np.testing.assert_allclose(get_activation("silu")(z.copy()), torch.nn.functional.silu(torch.tensor(z)).numpy(),
                               rtol=1e-12, atol=1e-15)


def test_silu_trains_summarizes_predicts_and_exports(capsys, tmp_path):
    cfg = ROOT / "configs" / "heart_mlp.yaml"
    code, out, err = run_cli(capsys, "summary", cfg, "--set", "model.layers.0.activation=silu")
    assert code == 0 and "dense_0" in out, out + err
    code, _, err = run_cli(capsys, "train", cfg, "--set", "model.layers.0.activation=silu", "--set", "training.epochs=3",
                           "--out", tmp_path / "run", "-q")
    assert code == 0, err
    data = ROOT / "datasets" / "heart_cleveland.csv"
    _export_and_compare(capsys, tmp_path / "run", data, None, "disease", tmp_path)


def test_the_readme_lists_every_declared_activation_and_its_alpha():
    """README's "Activations:" line is the registry's: every name, `alpha` where one is declared."""
    import re
    line = next(t for t in (ROOT / "README.md").read_text().splitlines() if t.startswith("Activations: "))
    shown = dict(re.findall(r"(\w+)( \(`alpha`\))?", line.removeprefix("Activations: ")))
    assert set(shown) == set(DECLARATIONS), line
    assert {n for n, alpha in shown.items() if alpha} == {n for n, d in DECLARATIONS.items() if d.alpha is not None}
