"""A model file's whole inference path as one ONNX graph (opset 17; 20 where it reads text cells, which
it matches without their surrounding whitespace by RegexFullMatch, as `predict` strips them): raw rows
in, what `predict` prints out. Preprocessing the model stored (imputation, missing indicators, one-hot categories,
booleans, scaling, normalization, reshaping) runs inside the graph, then every layer, then the head
(class probabilities and labels, or regression values in the data's units). Each layer writes its own
nodes (`Layer.onnx`, beside its math in nn/layers.py); this module assembles the graph around them. `onnx`
is imported here only, lazily, so the package works without it."""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

from .. import __version__
from ..data.cells import MissingTokens
from ..errors import MagmaError
from ..nn.embedding import ColumnEmbeddings
from ..nn.layers import build_layers
from ..data.targets import target_task
from .modelfile import SavedModel
from ..data.onnx_cells import number_tokens

OPSET = 17  # the lowest opset of any graph
TEXT_OPSET = 20  # a graph that reads text cells (categories, booleans): RegexFullMatch
OUTPUTS = ("probabilities", "label", "prediction")


class Graph:
    """The ONNX nodes, constants, inputs and outputs being assembled; names are made unique."""

    def __init__(self) -> None:
        import onnx  # an optional dependency: the [onnx] extra
        self.onnx, self.helper = onnx, onnx.helper
        self.nodes: list[Any] = []
        self.constants: list[Any] = []
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []
        self.count = 0
        self.inputs_of: dict[str, str] = {}  # column -> its input's name (`name_inputs`)
        self.taken: set[str] = {"features", *OUTPUTS}  # names no node output may take

    def name(self, hint: str) -> str:
        """A value name no input or output has (a column may be called 'add_3')."""
        self.count += 1
        while f"{hint}_{self.count}" in self.taken:
            self.count += 1
        return f"{hint}_{self.count}"

    def name_inputs(self, columns: list[str]) -> None:
        """Each column's input name: the column's own, but for an empty name (R's and pandas' row
        index: 'Unnamed: 0' as pandas reads it back, by its place) or one an output has ('label_input')."""
        for i, column in enumerate(columns):
            name = column if column and column not in OUTPUTS else f"Unnamed: {i}" if not column else f"{column}_input"
            while name in self.inputs_of.values() or name in columns[i + 1:]:
                name += "_"
            self.inputs_of[column] = name
        self.taken.update(self.inputs_of.values())

    def input(self, column: str, elem: int, doc: str) -> str:
        """The (N, 1) input of a column; its doc string names the column where the input's name differs."""
        name = self.inputs_of[column]
        doc = doc if name == column else f"the column {column!r}: {doc}"
        self.inputs.append(self.helper.make_tensor_value_info(name, elem, ["N", 1], doc))
        return name

    def const(self, value: Any, hint: str = "c", dtype: Any = np.float32) -> str:
        from onnx import numpy_helper
        array = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
        name = self.name(hint)
        if array.dtype.kind in "OUS":
            tensor = self.helper.make_tensor(name, self.onnx.TensorProto.STRING, array.shape,
                                             [str(v).encode() for v in array.ravel()])
        else:
            tensor = numpy_helper.from_array(array, name)
        self.constants.append(tensor)
        return name

    def branch(self, build: Callable[[], str], name: str) -> Any:
        """A subgraph (an If's branch) of the nodes `build` adds, its float output the value it returns;
        it reads the outer graph's values and constants."""
        outer, self.nodes = self.nodes, []
        try:
            out = build()
            nodes = self.nodes
        finally:
            self.nodes = outer
        return self.helper.make_graph(nodes, name, [], [self.helper.make_tensor_value_info(
            out, self.onnx.TensorProto.FLOAT, None)])

    def op(self, kind: str, *inputs: str, domain: str = "", **attributes: Any) -> str:
        out = self.name(kind.lower())
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], domain=domain or None, **attributes))
        return out

    def output(self, value: str, name: str, elem: int, shape: list[Any]) -> None:
        self.nodes.append(self.helper.make_node("Identity", [value], [name]))
        self.outputs.append(self.helper.make_tensor_value_info(name, elem, shape))


def required_opset(saved: SavedModel) -> int:
    """The lowest opset the graph of `saved` can be written in."""
    return TEXT_OPSET if any(c.form.declaration.cell == "text" for c in saved.encoder.columns) else OPSET


def build(saved: SavedModel, file_columns: list[str] | None, opset: int) -> Any:
    """The ONNX ModelProto of `saved` (`opset` at least `required_opset`); `file_columns`: the
    `features` input's columns when every used column is a number (`export.input_columns`, from the
    model file alone), None for arrays."""
    g = Graph()
    g.name_inputs([c.name for c in saved.encoder.inputs()])
    if opset > g.onnx.defs.onnx_opset_version():
        raise MagmaError(f"--opset {opset}: the onnx package here (version {g.onnx.__version__}) knows opsets up to "
                         f"{g.onnx.defs.onnx_opset_version()}; give one of them (a runtime may know fewer)")
    x = _inputs(g, saved, file_columns)
    unread = g.op("Greater", g.op("ReduceSum", g.op("Cast", g.op("IsNaN", x), to=g.onnx.TensorProto.FLOAT),
                                  g.const([1], "axis", np.int64), keepdims=1), g.const(0.0, "zero"))
    x = g.op("Reshape", x, g.const([-1, *saved.sample_shape], "shape", np.int64))
    shape = saved.sample_shape
    embedded = saved.encoder.embedded()
    for layer in [ColumnEmbeddings(embedded)] * bool(embedded) + build_layers(saved.config.model.layers):
        shape = layer.build(shape)  # its input shape, and its inner layers' (a block's)
        x = layer.onnx(g, x, saved.weights)  # each layer's exporter is beside its math (nn/layers.py)
    target_task(saved.task).onnx(g, x, saved, unread)
    graph = g.helper.make_graph(g.nodes, "magmadnn", g.inputs, g.outputs, g.constants)
    opsets = [g.helper.make_opsetid("", opset), g.helper.make_opsetid("ai.onnx.ml", 3)]
    model = g.helper.make_model(graph, opset_imports=opsets, producer_name="magmadnn", producer_version=__version__)
    model.ir_version = g.helper.find_min_ir_version_for(opsets, ignore_unknown=True)  # what older runtimes read
    meta = {"labels": ",".join(map(str, saved.classes)), "columns": ",".join(saved.features),
            "magmadnn_version": __version__, "task": saved.task,
            "inputs": "; ".join(f"{i.name}: {i.doc_string}" for i in g.inputs),
            "input_columns": json.dumps(_input_columns(g, saved, file_columns), ensure_ascii=False)}
    g.helper.set_model_props(model, meta)
    g.onnx.checker.check_model(model, full_check=True)
    return model


def _input_columns(g: Graph, saved: SavedModel, file_columns: list[str] | None) -> dict[str, Any]:
    """What each input holds: {input: column} for one input per column, {'features': [columns]} for one
    matrix of them (None: arrays or images, as read)."""
    if _per_column(saved):
        return {g.inputs_of[c.name]: c.name for c in saved.encoder.inputs()}
    return {"features": file_columns}


def _per_column(saved: SavedModel) -> bool:
    """Whether the graph takes one input per column (text or dates among them), not one matrix."""
    return any(c.form.declaration.cell not in ("number", "") for c in saved.encoder.columns)


# -- inputs and preprocessing -----------------------------------------------------------------------
def _inputs(g: Graph, saved: SavedModel, file_columns: list[str] | None) -> str:
    """The encoded, normalized feature matrix (N, width) from the graph's inputs."""
    if not _per_column(saved):
        encoded = _number_matrix(g, saved, file_columns)
    else:
        tokens = MissingTokens.of(saved.config.data.missing_tokens)
        encoded = g.op("Concat", *(c.form.onnx(g, c, tokens) for c in saved.encoder.inputs()), axis=1)
    return _normalize(g, saved, encoded)


def _number_matrix(g: Graph, saved: SavedModel, file_columns: list[str] | None) -> str:
    """One float32 input `features` (N, F): the file's columns in order; the used ones gathered,
    imputed and given their missing indicators."""
    float_ = g.onnx.TensorProto.FLOAT
    if file_columns is None:  # arrays or images: (N, C, H, W) / (N, ...), each sample in the model's shape
        g.inputs.append(g.helper.make_tensor_value_info("features", float_, ["N", *saved.sample_shape],
                                                        f"float32 samples, each of shape {tuple(saved.sample_shape)}"))
        return g.op("Flatten", "features", axis=1)
    g.inputs.append(g.helper.make_tensor_value_info("features", float_, ["N", len(file_columns)],
                                                    f"float32 columns {', '.join(file_columns)} (NaN: missing)"))
    where = {name: i for i, name in enumerate(file_columns)}
    if not saved.encoder.columns:  # numbers as read: only the columns the model uses
        used = [where[name] for name in saved.features]
        return "features" if used == list(range(len(file_columns))) else \
            g.op("Gather", "features", g.const(used, "used", np.int64), axis=1)
    columns = saved.encoder.inputs()
    picked = g.op("Gather", "features", g.const([where[c.name] for c in columns], "used", np.int64), axis=1)
    picked = number_tokens(g, picked, MissingTokens.of(saved.config.data.missing_tokens))
    fills = g.const([[float(c.fill) for c in columns]], "fill")
    missing = g.op("IsNaN", picked)
    filled = g.op("Where", missing, fills, picked)
    if not any(c.indicator for c in columns):
        return filled
    parts = []
    for i, column in enumerate(columns):
        index = g.const([i], "col", np.int64)
        parts.append(g.op("Gather", filled, index, axis=1))
        if column.indicator:
            parts.append(g.op("Cast", g.op("Gather", missing, index, axis=1), to=float_))
    return g.op("Concat", *parts, axis=1)


def _normalize(g: Graph, saved: SavedModel, encoded: str) -> str:
    """(x * scale - shift) / spread per encoded column, as the model's Normalizer computes it; an
    infinite value (an infinite cell, or one the normalization overflows: predict refuses both) NaN,
    so its row gets no answer."""
    norm = saved.normalizer
    x = g.op("Mul", encoded, g.const(np.float32(norm.scale), "scale")) if norm.scale != 1.0 else encoded
    return _no_infinity(g, g.op("Div", g.op("Sub", x, g.const(norm.shift, "shift")), g.const(norm.spread, "spread")))


def _no_infinity(g: Graph, x: str) -> str:
    return g.op("Where", g.op("IsInf", x), g.const(float("nan"), "nan"), x)


