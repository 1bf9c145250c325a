"""`magmadnn export`: a model file (or run folder) as one ONNX graph, preprocessing included, that
onnxruntime runs to what `predict --proba` prints (see `training/onnx_graph.py`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..data.readers import READERS
from ..errors import MagmaError
from ..files import atomic_write, check_output_file
from ..inference import Predictor
from ..training.modelfile import SavedModel
from ..training.onnx_graph import OPSET, required_opset
from ..training.run_folder import RunFolder, record_made


def export(model_path: Path, out: Path | None, overwrite: bool = False, opset: int | None = None) -> dict[str, Any]:
    """Write the ONNX file atomically to `out` (None: model.onnx beside the model file; an existing file
    is replaced only with `overwrite`) in `opset` (None: the lowest the model needs); returns what was
    written: path, inputs, outputs, opset, size and seconds."""
    if opset is not None and opset < OPSET:
        raise MagmaError(f"--opset {opset}: magmadnn writes its graphs in ONNX opset {OPSET} or newer (every op in "
                         f"its opset-{OPSET} form; onnxruntime 1.12 and later run them): give --opset {OPSET} or more")
    model_path = RunFolder.model_file(model_path)
    given, out = out is not None, out or model_path.with_suffix(".onnx")
    check_output_file(out, (model_path,), overwrite, given)
    saved = Predictor(model_path, "cpu").saved  # every check predict makes: weights present and shaped, labels

    needed = required_opset(saved)
    if opset is not None and opset < needed:
        raise MagmaError(f"--opset {opset}: {model_path} reads text columns (categories or booleans), which its graph "
                         f"matches without their surrounding spaces, as predict does, by RegexFullMatch (opset "
                         f"{needed}; onnxruntime 1.17 and later): give --opset {needed} or more, or leave --opset out")
    started = time.perf_counter()
    try:
        from ..training.onnx_graph import build  # onnx is optional
    except ImportError as exc:
        raise MagmaError("export needs the onnx package: pip install 'magmadnn-cli[onnx]'") from exc
    opset = opset or needed
    model = build(saved, input_columns(saved), opset)
    data = model.SerializeToString()
    atomic_write(out, lambda f: f.write(data))
    record_made(out, data)  # in a run folder: a later run that replaces the model removes this export
    return {"path": str(out), "inputs": [i.name for i in model.graph.input],
            "outputs": [o.name for o in model.graph.output],
            "opset": opset, "bytes": len(data), "seconds": round(time.perf_counter() - started, 3)}


def written(done: dict[str, Any]) -> str:
    """What `export` says of the file it wrote."""
    return (f"wrote {done['path']} ({done['bytes']:,} bytes, opset {done['opset']}): inputs {', '.join(done['inputs'])}; "
            f"outputs {', '.join(done['outputs'])}")


def input_columns(saved: SavedModel) -> list[str] | None:
    """The `features` input's columns, from the model file alone (never from the training file, which
    may have changed since): data.names but the target where the config gives them (a headerless
    file's rows go in as they are), else the columns the model reads, in its order; None for arrays
    and images (NPZ, IDX, CIFAR, image folders, synthetic data)."""
    cfg = saved.config.data
    if cfg.names:
        return [n for n in cfg.names if n not in cfg.target_columns]
    if cfg.synthetic is not None or not cfg.train:
        return None
    path = Path(cfg.train)
    reader = next((r for r in READERS if r.name != "images" and r.matches(path)), None)  # by the name alone
    return list(saved.features) if reader is not None and reader.columns is not None else None
