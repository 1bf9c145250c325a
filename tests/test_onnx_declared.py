"""Each layer's ONNX exporter lives beside its math (`Layer.onnx` in nn/layers.py); `onnx_graph` only
assembles the graph. Every layer of the registry exports, and its graph computes what the layer does
(onnxruntime against the network's eval-mode forward pass, with every weight and buffer random)."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from magmadnn_cli.config.layers import LayerSpec
from magmadnn_cli.errors import MagmaError
from magmadnn_cli.nn.layers import LAYERS, Layer, build_layers
from magmadnn_cli.nn.network import Network

SHAPES = [(2, 5, 5), (6,)]  # an image-like sample and a flat one; each layer is tried on every one it takes
SHIPPED = sorted(tag for tag, cls in LAYERS.items() if cls.__module__.startswith("magmadnn_cli"))


def _value(annotation: typing.Any, shape: tuple[int, ...], tag: str) -> typing.Any:
    """A valid value of a required field, from its annotation alone (the last of a Literal's names,
    the sample's shape for a list of sizes, a shape-keeping layer with weights for a list of layers)."""
    annotation = _bare(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return args[-1]
    if origin is typing.Union:
        return _value(next(a for a in args if a is not type(None)), shape, tag)
    if origin is list:
        if args and _bare(args[0]) is int:
            return list(shape)
        keeping = [t for t in SHIPPED if t != tag and _keeps(t, shape)]
        inner = min(keeping, key=lambda t: not _built(t, shape)[0].specs)  # one with weights, where one fits
        return [{"type": inner, **_example(inner, shape)}]
    return {int: 3, float: 0.25, bool: True}[annotation]


def _bare(annotation: typing.Any) -> typing.Any:
    """A constrained type's base type (PositiveInt: int)."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _example(tag: str, shape: tuple[int, ...]) -> dict[str, typing.Any]:
    """Hyperparameters of a `tag` layer: its required fields filled, an activation field set too."""
    fields = LayerSpec.declarations[tag].model_fields
    return {name: _value(f.annotation, shape, tag) for name, f in fields.items()
            if name != "type" and (f.is_required() or name == "activation")}


def _built(tag: str, shape: tuple[int, ...]) -> list[Layer] | None:
    """The layer built on samples of `shape`, or None where it refuses that shape."""
    try:
        layers = build_layers([LayerSpec.declarations[tag].of(**_example(tag, shape))])
        layers[0].build(shape)
    except (MagmaError, StopIteration, KeyError):
        return None
    return layers


def _keeps(tag: str, shape: tuple[int, ...]) -> bool:
    layers = _built(tag, shape)
    return layers is not None and layers[0].output_shape == shape


def _onnx_outputs(layers: list[Layer], shape: tuple[int, ...], state: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The layers' ONNX graph (made by their own exporters on the exporter's builder) run by onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    from magmadnn_cli.training.onnx_graph import OPSET, Graph
    g = Graph()
    g.inputs.append(g.helper.make_tensor_value_info("features", g.onnx.TensorProto.FLOAT, ["N", *shape]))
    value, out = "features", shape
    for layer in layers:
        out = layer.build(out)  # as the exporter builds them: to the model's shapes, weights from the file
        value = layer.onnx(g, value, state)
    g.output(value, "prediction", g.onnx.TensorProto.FLOAT, ["N", *out])
    graph = g.helper.make_graph(g.nodes, "layer", g.inputs, g.outputs, g.constants)
    model = g.helper.make_model(graph, opset_imports=[g.helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    g.onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"features": x})[0]


@pytest.mark.parametrize("tag", SHIPPED)
def test_every_registered_layer_exports_what_it_computes(tag):
    pytest.importorskip("onnx")
    exported = 0
    for shape in SHAPES:
        layers = _built(tag, shape)
        if layers is None:
            continue
        net = Network(layers, shape, seed=0)
        rng = np.random.default_rng(1)
        state = {k: rng.uniform(0.5, 1.5, v.shape).astype(np.float32) for k, v in net.state_dict().items()}
        net.load_state_dict(state)
        x = rng.normal(size=(4, *shape)).astype(np.float32)
        want = np.asarray(net.predict(x))
        got = _onnx_outputs(build_layers([layer.spec for layer in layers]), shape, state, x)
        np.testing.assert_allclose(got, want.reshape(got.shape), rtol=2e-5, atol=2e-6, err_msg=f"{tag} on {shape}")
        exported += 1
    assert exported, f"{tag}: builds on none of {SHAPES}; give the test a sample shape it takes"


def test_the_exporter_holds_no_registry_of_its_own():
    """A new layer is its declaration and its class (math and exporter): onnx_graph keys nothing by type."""
    from magmadnn_cli.training import onnx_graph
    assert not any(isinstance(v, dict) and set(v) & set(SHIPPED) for k, v in vars(onnx_graph).items()
                   if not k.startswith("__"))
    for tag in SHIPPED:
        assert "onnx" in vars(LAYERS[tag]) or LAYERS[tag].onnx is not Layer.onnx, tag


def test_a_layer_without_an_exporter_is_refused_by_name():
    pytest.importorskip("onnx")
    from magmadnn_cli.training.onnx_graph import Graph
    bare = Layer(LayerSpec.declarations["flatten"].of(), name="mine")
    with pytest.raises(MagmaError, match=r"layer 'mine' \(flatten\) cannot be exported to ONNX yet"):
        bare.onnx(Graph(), "features", {})

