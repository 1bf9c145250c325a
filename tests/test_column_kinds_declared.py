"""Each column kind is declared once (`config/column_kinds.py`) with its runtime beside it
(`data/column_kinds.py`: inference rule, fill, encoding, ONNX form). The registry is complete both ways,
the config's choices are the declared kinds, and every kind's ONNX form computes its encoding
(onnxruntime against `encode`, on cells with blanks, for every kind the encoder fits)."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from magmadnn_cli.config.column_kinds import DECLARATIONS, DECLARED
from magmadnn_cli.config.data import ColumnKind, DataConfig
from magmadnn_cli.data.cells import MissingTokens, RawColumns
from magmadnn_cli.data.column_kinds import FORMS, INFERRED, ColumnForm
from magmadnn_cli.data.fitting import fit

ENCODED = sorted(name for name, d in DECLARATIONS.items() if d.encoded)
CELLS = {  # a column of each kind as a file holds it, blanks among them
    "number": ["1.5", "", "-2", "7", "0.25", "3"],
    "category": ["red", "blue", "", "red", "green", " blue "],
    "boolean": ["yes", "no", "", "Yes", "no", "yes"],
    "date": ["2024-03-15", "", "1999-12-31T23:30", "2024-02-29", "1970-01-01", "2001-07-04"],
}


def test_every_encoded_kind_has_exactly_one_runtime_form_and_back():
    assert set(FORMS) == set(ENCODED) and ENCODED
    for name, form in FORMS.items():
        assert form.declaration is DECLARATIONS[name]
    with pytest.raises(TypeError, match="already implemented"):
        type("Twin", (type(FORMS["number"]),), {"declaration": DECLARATIONS["number"]})


def test_the_config_offers_exactly_the_declared_kinds():
    assert set(typing.get_args(ColumnKind)) == set(DECLARED)
    assert all(DECLARATIONS[name].declared for name in DECLARED)
    undeclared = set(DECLARATIONS) - set(DECLARED)
    assert undeclared and not undeclared & set(typing.get_args(ColumnKind))


def test_inference_rules_are_the_forms_that_declare_one():
    """The kinds inferred from text cells are those whose form has a rule; each reads its own cells
    and no other kind's."""
    assert INFERRED and all(type(f).infers is not ColumnForm.infers for f in INFERRED)
    for form in INFERRED:
        name = form.declaration.name
        assert form.infers(np.array([c for c in CELLS[name] if c.strip()]), "") is not None
        others = [k for k in CELLS if k != name and k != "number"]
        assert all(form.infers(np.array([c for c in CELLS[k] if c.strip()]), "") is None for k in others)


def _fitted(kind: str, indicator: bool):
    raw = RawColumns(np.full((len(CELLS[kind]), 1), np.nan), {0: np.array(CELLS[kind])})
    cfg = DataConfig(train="t.csv", target="y", columns={"c": {"type": kind, "indicator": indicator}})
    encoder, _ = fit(raw, ["c"], cfg, "t.csv")
    return encoder, raw


def _graph_input(kind: str, cells: list[str]) -> np.ndarray:
    """The cells as the kind's exported input takes them (its declaration's `cell`)."""
    from magmadnn_cli.data import dates
    cell = DECLARATIONS[kind].cell
    if cell == "number":
        return np.array([[float(c) if c.strip() else np.nan] for c in cells], np.float32)
    if cell == "seconds":
        return dates.seconds(np.array(cells), "").reshape(-1, 1)
    return np.array(cells, dtype=object).reshape(-1, 1)


@pytest.mark.parametrize("indicator", [False, True])
@pytest.mark.parametrize("kind", [k for k in ENCODED if DECLARATIONS[k].cell])
def test_each_kinds_onnx_form_computes_its_encoding(kind, indicator):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from magmadnn_cli.training.onnx_graph import TEXT_OPSET, Graph
    encoder, raw = _fitted(kind, indicator)
    column = encoder.columns[0]
    assert column.kind == kind and column.width == len(column.values()) + indicator
    expected, _ = encoder.transform(raw, "t.csv")
    g = Graph()
    g.name_inputs(["c"])
    block = column.form.onnx(g, column, MissingTokens())
    g.output(g.op("Cast", block, to=g.onnx.TensorProto.FLOAT), "encoded", g.onnx.TensorProto.FLOAT, ["N", None])
    graph = g.helper.make_graph(g.nodes, "kind", g.inputs, g.outputs, g.constants)
    model = g.helper.make_model(graph, opset_imports=[g.helper.make_opsetid("", TEXT_OPSET)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"c": _graph_input(kind, CELLS[kind])})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
