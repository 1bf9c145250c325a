"""The model file: one `.npz` that numpy loads with `allow_pickle=False`.

Keys:
  format            "magmadnn-model"                 (0-d string array)
  format_version    1                                (0-d int array)
  meta              JSON: config, classes, features (the raw input columns), columns (their fitted
                    encoding: kind, fill value, indicator, categories), target_scale (regression
                    targets' shift and spread), sample_shape, task, scale, metrics, version
  norm/shift        per-feature shift of the input normalization (float32)
  norm/spread       per-feature divisor of the input normalization (float32)
  weights/<layer>/<weight>   e.g. weights/dense_0/kernel (inputs x units), weights/dense_0/bias (units,)
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from .. import __version__
from ..config.messages import data_path
from ..config.rules import output_head
from ..config.schema import Config
from ..config.tasks import resolved_task
from ..data.columns import ColumnEncoder
from ..data.prepare import Normalizer, TargetScaler
from ..data.targets import target_task
from ..errors import ModelFileError
from ..files import atomic_write, load_npz
from ..nn.network import Network
from .run_folder import RunFolder

FORMAT = "magmadnn-model"
FORMAT_VERSION = 1


@dataclass
class SavedModel:
    config: Config
    weights: dict[str, np.ndarray]
    normalizer: Normalizer
    classes: list[Any]
    features: list[str]
    sample_shape: tuple[int, ...]
    task: str
    metrics: dict[str, Any]
    encoder: ColumnEncoder
    targets: TargetScaler


def save(path: Path, network: Network, config: Config, data: Any, task: str, metrics: dict[str, Any],
         weights: dict[str, np.ndarray]) -> None:
    """`data` is the run's Prepared: its normalizer, classes, features, column encoding and target
    scaling are what predict needs besides the weights (`weights`: the network's `state_dict()`,
    gathered whole, which under model parallelism takes every rank)."""
    normalizer = data.normalizer
    meta = {"config": config.model_dump(mode="json"), "classes": data.classes, "features": data.features,
            "columns": data.encoder.to_json() if data.encoder.columns else None,
            "target_scale": {"shift": data.targets.shift.tolist(), "spread": data.targets.spread.tolist()}
            if data.targets.active else None,
            "sample_shape": list(network.input_shape), "task": task, "scale": normalizer.scale,
            "metrics": metrics, "magmadnn_version": __version__}
    arrays = {"format": np.array(FORMAT), "format_version": np.array(FORMAT_VERSION),
              "meta": np.array(json.dumps(meta, default=str)),
              "norm/shift": normalizer.shift, "norm/spread": normalizer.spread}
    arrays.update({f"weights/{name}": w for name, w in weights.items()})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write(path, lambda f: f.write(buffer.getvalue()))


def load(path: Path) -> SavedModel:
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"{path}: model file not found")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory; expected a model .npz (e.g. {RunFolder(path).model})")
    f = load_npz(path, "magmadnn model file", ModelFileError)
    if "format" not in f:
        raise ModelFileError(f"{path}: not a magmadnn model (no 'format' entry); it holds {sorted(f)[:8]}")
    if str(f["format"]) != FORMAT:
        raise ModelFileError(f"{path}: not a magmadnn model (format {str(f['format'])!r})")
    try:
        version = int(f["format_version"])
        if version > FORMAT_VERSION:
            raise ModelFileError(f"{path}: model format version {version} is newer than this magmadnn "
                                 f"understands ({FORMAT_VERSION}); upgrade magmadnn")
        meta = _parse_meta(str(f["meta"]))
        weights = {k.removeprefix("weights/"): v for k, v in f.items() if k.startswith("weights/")}
        shift, spread = f["norm/shift"], f["norm/spread"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"{path}: corrupt model file ({type(exc).__name__}: {exc})") from exc
    try:
        config = Config.model_validate(meta["config"])
        columns, scale = meta.get("columns"), meta.get("target_scale")
        encoder = ColumnEncoder.from_json(columns) if columns else ColumnEncoder([])
        targets = TargetScaler(np.asarray(scale["shift"], np.float64), np.asarray(scale["spread"], np.float64)) \
            if scale else TargetScaler()
        saved = SavedModel(config, weights, Normalizer(float(meta["scale"]), shift, spread), meta["classes"],
                           meta["features"], tuple(int(n) for n in meta["sample_shape"]), meta["task"],
                           meta.get("metrics", {}), encoder, targets)
    except ValidationError as exc:
        raise ModelFileError(_config_problem(path, exc, meta)) from exc
    except Exception as exc:  # a model whose metadata does not fit the schema is corrupt, whatever broke
        raise ModelFileError(f"{path}: corrupt model metadata ({type(exc).__name__}: {exc})") from exc
    problem = _inconsistency(saved)
    if problem:
        raise ModelFileError(f"{path}: corrupt model file: {problem}")
    return saved


def _config_problem(path: Path, exc: ValidationError, meta: dict[str, Any]) -> str:
    """A file a newer magmadnn wrote: what this one does not know, and 'upgrade'; else corruption:
    the first problem, located."""
    errors, written_by = exc.errors(), meta.get("magmadnn_version")
    located = [".".join(map(str, data_path(meta["config"], e["loc"]))) or "(top level)" for e in errors]
    if _newer(written_by):
        unknown = [where for where, e in zip(located, errors) if e["type"] == "extra_forbidden"]
        what = f"settings this one does not know ({', '.join(unknown)})" if unknown else \
            f"a config this one does not read ({located[0]}: {errors[0]['msg'].removeprefix('Value error, ')})"
        return f"{path}: written by magmadnn {written_by}, newer than this one ({__version__}), with {what}: upgrade magmadnn"
    return (f"{path}: corrupt model metadata: its config does not validate: {located[0]}: "
            f"{errors[0]['msg'].removeprefix('Value error, ')}")


def _newer(version: Any) -> bool:
    """Whether a version string ('0.2.0', '1.0.0rc1') is above this magmadnn's."""
    parts = lambda text: tuple(int(n) for n in re.findall(r"\d+", str(text).split("+")[0])[:3])  # noqa: E731
    return isinstance(version, str) and parts(version) > parts(__version__)


MAX_META_DEPTH = 64  # a model's metadata nests a few levels (config sections, metric tables)


def _parse_meta(text: str) -> Any:
    """The metadata JSON, its nesting bounded before parsing (a forged file nested 100,000 deep would
    exhaust the parser's recursion)."""
    depth = _json_depth(text)
    if depth > MAX_META_DEPTH:
        raise ValueError(f"the metadata JSON is nested {depth:,} levels deep; a model's nests a few")
    return json.loads(text)


def _json_depth(text: str) -> int:
    """The deepest nesting of [ and { in JSON text, brackets inside strings not counted (linear time)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text).encode("utf-8", "replace")
    codes = np.frombuffer(bare, dtype=np.uint8)
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def _inconsistency(saved: SavedModel) -> str | None:
    """What in a model file does not fit together (None when it all does)."""
    return _dtype_problem(saved) or _field_problem(saved) or _task_problem(saved) or _shape_problem(saved)


def _field_problem(saved: SavedModel) -> str | None:
    """Metadata fields of the right kinds: feature names, sample sizes, the input scale, metrics."""
    if not isinstance(saved.features, list) or not all(isinstance(n, str) for n in saved.features):
        return f"its feature names are not a list of names: {str(saved.features)[:80]}"
    if not saved.sample_shape or min(saved.sample_shape) < 1:
        return f"its sample shape {saved.sample_shape} is not a list of positive sizes"
    if not (np.isfinite(saved.normalizer.scale) and saved.normalizer.scale > 0):
        return f"its input scale {saved.normalizer.scale} is not a positive number"
    if not isinstance(saved.metrics, dict):
        return "its metrics are not a mapping"
    return None


def _dtype_problem(saved: SavedModel) -> str | None:
    """Weights and normalization are real floating-point numbers; a complex, integer or text array is
    named with its dtype."""
    arrays = {"norm/shift": saved.normalizer.shift, "norm/spread": saved.normalizer.spread} | saved.weights
    odd = [(k, w.dtype) for k, w in arrays.items() if w.dtype.kind != "f"]
    if odd:
        listed = ", ".join(f"{k} ({dtype})" for k, dtype in odd[:5])
        return f"arrays {listed} are not real floating-point numbers (float32 or float64 expected)"
    return None


def _task_problem(saved: SavedModel) -> str | None:
    """The metadata's task and class labels agree with the loss and output head its config declares."""
    loss = saved.config.loss
    if saved.task not in {loss.task, resolved_task(loss.task, label_sets=True).name}:  # binary: or multi-label
        head = output_head(saved.config.model.layers, loss.type)
        return (f"the metadata says task {saved.task!r}, but its loss {loss.type} with a {head.activation} output "
                f"(model.layers.{head.index}) makes it a {loss.task} model")
    classes = saved.classes
    if not isinstance(classes, list) or not all(isinstance(c, (str, int, float)) for c in classes):
        return f"its class labels are not a list of labels (text or numbers): {str(classes)[:80]}"
    if problem := target_task(saved.task).labels_problem(len(classes)):
        return problem
    repeated = sorted(label for label, n in Counter(map(str, classes)).items() if n > 1)
    if repeated:
        return f"its class labels repeat: {', '.join(map(repr, repeated[:5]))}"
    return None


def _shape_problem(saved: SavedModel) -> str | None:
    width = int(np.prod(saved.sample_shape)) if saved.sample_shape else 0
    for name, vector in (("norm/shift", saved.normalizer.shift), ("norm/spread", saved.normalizer.spread)):
        if vector.shape != (width,):
            return f"{name} has shape {vector.shape}; the samples have {width} values {saved.sample_shape}"
    if not np.all(np.isfinite(saved.normalizer.spread)) or np.any(saved.normalizer.spread == 0) or \
            not np.all(np.isfinite(saved.normalizer.shift)):
        return "the input normalization holds zeros, NaN or infinities"
    if saved.encoder.columns:
        if saved.encoder.width != width or [c.name for c in saved.encoder.columns] != saved.features:
            return f"the column encoding gives {saved.encoder.width} values for samples of {width} values"
    elif len(saved.features) != width and saved.features:
        return f"{len(saved.features)} feature names for samples of {width} values"
    targets = saved.targets
    if targets.active and not (np.all(np.isfinite(targets.spread)) and np.all(targets.spread > 0)
                               and np.all(np.isfinite(targets.shift)) and targets.shift.shape == targets.spread.shape):
        return "the target scaling holds zeros, NaN or infinities, or shifts and spreads of different sizes"
    bad = [k for k, w in saved.weights.items() if not np.all(np.isfinite(w))]
    if bad:
        return f"weights {', '.join(bad[:5])} are not finite numbers (NaN or infinity): predictions would be NaN"
    return None
