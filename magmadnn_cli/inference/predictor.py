"""A saved model loaded once, for every command and server that predicts with it: the model file read
and checked, the network rebuilt on its backend, tables encoded with the model's own encoding,
predictions made in bounded batches, and decoded into the training data's labels or units."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ContextManager

import numpy as np

from ..core import backend as B
from ..data.readers import Table, typed_labels
from ..data.targets import target_task
from ..data.writers import Columns
from ..errors import ModelFileError
from ..nn.network import Network
from ..training.builder import build_network
from ..training.evaluation import inference_batches
from ..training.modelfile import SavedModel, load
from .encoding import encode, refuse_non_finite_outputs
from .image_rows import InputRows, count_missed


def restore(saved: SavedModel, path: Path | str | None = None) -> Network:
    """Rebuild the network from the saved config and load its weights: every weight present in its
    shape, the outputs as many as the class labels (`path`: the model file, named in the messages).
    Every command that reads a model file checks it here."""
    where = f"{path}: " if path is not None else ""
    network = build_network(saved.config, saved.sample_shape, embedded=saved.encoder.embedded())
    try:
        network.load_state_dict(saved.weights)
    except Exception as exc:
        raise ModelFileError(f"{where}the model's weights do not fit its architecture: {exc}") from exc
    outputs = network.output_shape[-1] if network.output_shape else 1
    expected = target_task(saved.task).width(saved.classes, outputs)
    if outputs != expected:
        raise ModelFileError(f"{where}corrupt model file: the network has {outputs} outputs for {len(saved.classes)} "
                             f"class labels ({saved.task})")
    if saved.targets.active and saved.targets.spread.shape != (outputs,):
        raise ModelFileError(f"{where}corrupt model file: the target scaling has {saved.targets.spread.size} values "
                             f"for the network's {outputs} outputs")
    return network


def output_rows(outputs: np.ndarray, saved: Any, proba: bool) -> np.ndarray:
    """Output rows as text: values and probabilities to the precision the model computes in (7
    significant digits for float32: a probability of 3e-9 stays one), labels as the training data
    spells them (`saved`: its task and classes)."""
    digits = "%.7g" if outputs.dtype == np.float32 else "%.15g"
    return target_task(saved.task).rows(outputs, saved.classes, proba, digits)


class Predictor:
    """The model in `path` (a model file), on `device` (auto, cpu or gpu) in its own precision."""

    def __init__(self, path: Path, device: str = "auto") -> None:
        self.path = path
        self.saved = load(path)
        self.backend = B.select(device, self.saved.config.precision)
        with self.using():
            self.network = restore(self.saved, path)

    def using(self) -> ContextManager[Any]:
        """The model's backend made current (around anything that computes with it)."""
        return B.using(self.backend)

    @property
    def task(self) -> str:
        return self.saved.task

    def columns(self, proba: bool, keep: tuple[str, ...] = ()) -> Columns:
        """The output's columns: kept ones (text), then the predictions: values (float), or the label
        (typed as the training labels) and with `proba` a probability (float) per class."""
        classes = self.saved.classes
        names, kinds = target_task(self.task).output_names(classes, self.network.output_shape[-1], proba)
        labels = typed_labels(np.array([str(c) for c in classes])) if classes else np.zeros(0)
        label = {"i": "int", "f": "float"}.get(labels.dtype.kind, "text")
        return Columns(list(keep) + names, ["text"] * len(keep) + [label if k == "label" else k for k in kinds])

    def outputs(self, x: np.ndarray, source: str, data_rows: Callable[[np.ndarray], list[int]]) -> np.ndarray:
        """The network's outputs for encoded rows `x`, in batches of the model's eval_batch_size (a
        regression's in the data's units); non-finite outputs are refused, naming `data_rows` of `source`."""
        saved = self.saved
        with self.using(), np.errstate(all="ignore"):  # an overflow is refused by row, not warned raw
            batches = inference_batches(self.network, 0, len(x), saved.config.training.eval_batch_size)
            parts = [B.to_host(self.network.predict(B.to_device(x[part]))) for part in batches]
            outputs = np.concatenate(parts) if parts else np.zeros((0,) + tuple(self.network.output_shape), np.float32)
            outputs = outputs if target_task(self.task).decl.labels else saved.targets.restore(outputs)
        refuse_non_finite_outputs(outputs, data_rows, source, self.path, saved)
        return outputs

    def rows(self, outputs: np.ndarray, proba: bool) -> np.ndarray:
        return output_rows(outputs, self.saved, proba)

    def encoded(self, table: Table, strict: bool, tally: dict[str, Any]) -> np.ndarray:
        """A table's rows as the network's inputs; counts rows, unseen categories and filled cells
        into `tally` (`encoding.new_tally`)."""
        with self.using():
            x = encode(table, self.saved, strict, tally)
        tally["rows"] += len(x)
        return x

    def table_outputs(self, x: np.ndarray, table: Table) -> np.ndarray:
        """`outputs` for `table`'s encoded rows `x`, a non-finite one named by its data row."""
        return self.outputs(x, table.source, lambda i: [table.raw.row(int(r)) for r in i])

    def predict_table(self, table: Table, proba: bool, keep: tuple[str, ...], strict: bool,
                      tally: dict[str, Any]) -> np.ndarray:
        """One table's output rows as text (kept columns first), counted into `tally`."""
        rows = self.rows(self.table_outputs(self.encoded(table, strict, tally), table), proba)
        return np.concatenate([np.stack([table.kept[k] for k in keep], axis=1), rows], axis=1) if keep else rows

    def predict_rows(self, rows: InputRows, proba: bool, keep: tuple[str, ...], strict: bool,
                     tally: dict[str, Any]) -> np.ndarray:
        """An output row per input row, in order (kept columns first): no prediction where the row's
        image could not be decoded (`image_rows`); all counted into `tally`."""
        count_missed(tally, rows)
        out = rows.spread(self.predict_table(rows.table, proba, (), strict, tally))
        return np.concatenate([np.stack([rows.kept[k] for k in keep], axis=1), out], axis=1) if keep else out
