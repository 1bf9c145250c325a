"""The tasks at run time, one class per declaration (`config/tasks.py`): how a task reads its labels
from the target cells, encodes them for the loss, counts correct outputs on the device, turns outputs
into predictions, scores them, and writes them as `predict` does. `target_task(name)` is the registry."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np

from ..config.tasks import DECLARATIONS, LABEL_SEPARATOR, TaskDecl, resolved_task
from ..core import backend as B
from ..core.registry import Registered
from ..errors import DataError
from .classes import case_variants
from .fitting import looks_like
from .metrics import classification_report, multilabel_report, regression_report

MANY_CLASSES = 50        # beyond this many classes, each needs ROWS_PER_CLASS rows on average
ROWS_PER_CLASS = 2


class TargetTask(Registered):
    """A task's behaviour; `declaration` is its declaration (name, whether its targets are labels)."""
    declaration: ClassVar[TaskDecl]
    implementations: ClassVar[dict[str, type["TargetTask"]]] = {}
    fewest_labels = 2

    @property
    def decl(self) -> TaskDecl:
        return self.declaration

    def labels(self, y: np.ndarray, source: str) -> list[Any]:
        """The class labels the target cells hold, sorted (none for numbers)."""
        return []

    def encode(self, y: np.ndarray, classes: list[Any], source: str, rows: Any = None) -> np.ndarray:
        """The targets as the loss takes them; `rows` (the table's `RawColumns`) numbers rows in messages."""
        raise NotImplementedError  # abstract

    def width(self, classes: list[Any], targets: int) -> int:
        """The output units this task needs for these labels (or `targets` target columns)."""
        return len(classes)

    def width_reason(self, classes: list[Any], source: str, targets: int) -> str:
        """Why it needs `width` units, for the message that refuses another output width (with labels
        that differ only in case, how to merge them)."""
        twins = case_variants(classes)
        return f"(the {len(classes)} classes in {source}: {', '.join(map(str, classes[:12]))})" + \
            (f"; {twins}" if twins else "")

    def labels_problem(self, count: int) -> str | None:
        """Why a saved model of this task cannot have `count` class labels (None: it can)."""
        fewest = self.fewest_labels if self.decl.labels else 0
        if count < fewest:
            return f"a {self.decl.name} model needs at least {fewest} class labels; it has {count}"
        if not self.decl.labels and count:
            return f"a {self.decl.name} model has no class labels; this one lists {count}"
        return None

    def codes(self, y: np.ndarray) -> np.ndarray | None:
        """One class code per row that stratified splits balance (None: the rows are shuffled only)."""
        return y.reshape(-1).astype(np.int64)

    def predicted(self, outputs: np.ndarray) -> np.ndarray:
        """What each row's outputs (probabilities or logits) predict, compactly: a class index per row,
        in the smallest unsigned type that holds it (1 byte a row for up to 256 classes: a streamed
        run's evaluation keeps every row's)."""
        return outputs.argmax(axis=1).astype(np.min_scalar_type(max(0, outputs.shape[1] - 1)), copy=False)

    def truth(self, y: np.ndarray) -> np.ndarray:
        """Encoded targets in the form `predicted` gives (class indices already unsigned kept as they are)."""
        return y.reshape(-1) if y.dtype.kind == "u" else y.reshape(-1).astype(np.int64)

    def accuracy(self, predicted: np.ndarray, truth: np.ndarray) -> float:
        """The share of predictions right (multi-label: of the (row, label) cells)."""
        return float((predicted == truth).mean()) if truth.size else 0.0

    def correct(self, logits: Any, y: Any, fused: bool) -> Any:
        """Rows predicted right in a training batch, on the device (a device scalar: no host read)."""
        return (logits.argmax(axis=1) == y).sum()

    def report(self, truth: np.ndarray, predicted: np.ndarray, classes: list[Any]) -> dict[str, Any]:
        return classification_report(truth, predicted, classes)

    def probabilities(self, outputs: np.ndarray) -> np.ndarray:
        """One probability per class (per label) and row."""
        return outputs

    def output_names(self, classes: list[Any], width: int, proba: bool) -> tuple[list[str], list[str]]:
        """`predict`'s columns for these labels: names and kinds (`text`, `int`, `float`, or `label`:
        typed as the training labels)."""
        probs = [f"prob_{c}" for c in classes] if proba else []
        return ["prediction"] + probs, ["label"] + ["float"] * len(probs)

    def rows(self, outputs: np.ndarray, classes: list[Any], proba: bool, digits: str) -> np.ndarray:
        """Output rows as text, labels as the training data spells them."""
        probs = self.probabilities(outputs)
        labels = np.array([str(c) for c in classes], dtype=object)
        predicted = labels[probs.argmax(axis=1)][:, None]
        return np.concatenate([predicted, np.char.mod(digits, probs).astype(object)], axis=1) if proba else predicted

    def onnx(self, g: Any, out: str, saved: Any, unread: str) -> None:
        """The exported model's outputs (on the ONNX exporter's builder `g`): `probabilities` per class
        and the `label`; a row with a cell predict refuses (`unread`) gets NaN and an empty label."""
        probs = g.op("Where", unread, g.const(float("nan"), "nan"), self.onnx_probabilities(g, out))
        g.output(probs, "probabilities", g.onnx.TensorProto.FLOAT, ["N", len(saved.classes)])
        index = g.op("ArgMax", probs, axis=1, keepdims=0)
        labels = g.const(np.array([str(c) for c in saved.classes], dtype=object), "labels", None)
        unread = g.op("IsNaN", g.op("ReduceSum", probs, g.const([1], "axis", np.int64), keepdims=0))
        no_label = g.const(np.array([""], dtype=object), "no_label", None)
        g.output(g.op("Where", unread, no_label, g.op("Gather", labels, index, axis=0)), "label",
                 g.onnx.TensorProto.STRING, ["N"])

    def onnx_probabilities(self, g: Any, out: str) -> str:
        return out


def target_task(name: str) -> TargetTask:
    """The runtime task of a declared name (its class holds no state)."""
    return TargetTask.implementations[name]()


class Classification(TargetTask):
    declaration = DECLARATIONS["classification"]
    def labels(self, y: np.ndarray, source: str) -> list[Any]:
        labels = [v.item() if hasattr(v, "item") else v for v in np.unique(y)]
        if len(labels) < 2:
            raise DataError(f"{source}: the target has a single class ({labels[0]!r}); need at least 2 to learn")
        _check_class_count(len(labels), len(y), source)
        return labels

    def encode(self, y: np.ndarray, classes: list[Any], source: str, rows: Any = None) -> np.ndarray:
        lookup = {str(label): i for i, label in enumerate(classes)}
        values, inverse = np.unique(y, return_inverse=True)
        unknown = [str(v) for v in values if str(v) not in lookup]
        if unknown:
            raise DataError(f"{source}: labels {', '.join(map(repr, unknown[:10]))} do not occur in the training data "
                            f"(known: {', '.join(repr(str(c)) for c in classes)})")
        return np.array([lookup[str(v)] for v in values], dtype=np.int64)[inverse.ravel()]


class Binary(Classification):
    declaration = DECLARATIONS["binary"]
    def labels(self, y: np.ndarray, source: str) -> list[Any]:
        labels = [v.item() if hasattr(v, "item") else v for v in np.unique(y)]
        if len(labels) > 2:
            twins = case_variants(labels)
            shown = ", ".join(repr(str(label)) for label in labels[:12]) + (", ..." if len(labels) > 12 else "")
            fix = (f"; for {len(labels)} classes use loss: cross_entropy with an output layer of {len(labels)} units "
                   "(activation: softmax), map them onto two with data.label_map, or, for several labels a row, "
                   f"write each row's labels in one cell separated by {LABEL_SEPARATOR!r} (multi-label)")
            raise DataError(f"{source}: binary_cross_entropy needs exactly 2 classes; the target has {len(labels)} "
                            f"({shown})" + (f"; {twins}" if twins else fix))
        return super().labels(y, source)

    def encode(self, y: np.ndarray, classes: list[Any], source: str, rows: Any = None) -> np.ndarray:
        return super().encode(y, classes, source).astype(B.current().floatx).reshape(-1, 1)

    def width(self, classes: list[Any], targets: int) -> int:
        return 1

    def width_reason(self, classes: list[Any], source: str, targets: int) -> str:
        return f"(binary_cross_entropy: {', '.join(map(str, classes[:12]))})"

    def labels_problem(self, count: int) -> str | None:
        return None if count == 2 else f"a binary model has 2 class labels; this one lists {count}"

    def predicted(self, outputs: np.ndarray) -> np.ndarray:
        return (outputs.reshape(-1) > 0.5).astype(np.uint8)

    def truth(self, y: np.ndarray) -> np.ndarray:
        return y.reshape(-1) if y.dtype.kind == "u" else (y.reshape(-1) > 0.5).astype(np.uint8)

    def correct(self, logits: Any, y: Any, fused: bool) -> Any:
        return ((logits > (0.0 if fused else 0.5)) == (y > 0.5)).sum()

    def probabilities(self, outputs: np.ndarray) -> np.ndarray:
        return np.concatenate([1 - outputs, outputs], axis=1)

    def onnx_probabilities(self, g: Any, out: str) -> str:
        return g.op("Concat", g.op("Sub", g.const(np.float32(1.0), "one"), out), out, axis=1)


class MultiLabel(TargetTask):
    declaration = DECLARATIONS["multilabel"]
    """Any set of labels a row: a cell of `|`-separated labels ("drama|comedy"), one sigmoid output
    per label; a prediction is every label whose probability passes 0.5."""
    fewest_labels = 1

    def labels(self, y: np.ndarray, source: str) -> list[Any]:
        return sorted({label for cell in _label_sets(y)[0] for label in cell})

    def encode(self, y: np.ndarray, classes: list[Any], source: str, rows: Any = None) -> np.ndarray:
        """One 0/1 column per label, built once per distinct cell (then gathered by row)."""
        lookup = {str(label): i for i, label in enumerate(classes)}
        cells, inverse = _label_sets(y)
        unknown = sorted({label for cell in cells for label in cell} - set(lookup))
        if unknown:
            raise DataError(f"{source}: labels {', '.join(map(repr, unknown[:10]))} do not occur in the training data "
                            f"(known: {', '.join(repr(str(c)) for c in classes)})")
        distinct = np.zeros((len(cells), len(classes)), B.current().floatx)
        for i, cell in enumerate(cells):
            distinct[i, [lookup[label] for label in cell]] = 1
        return distinct[inverse]

    def codes(self, y: np.ndarray) -> np.ndarray | None:
        return None

    def width_reason(self, classes: list[Any], source: str, targets: int) -> str:
        return f"(one sigmoid unit per label of {source}, multi-label: {', '.join(map(str, classes[:12]))})"

    def predicted(self, outputs: np.ndarray) -> np.ndarray:
        return (outputs > 0.5).astype(np.uint8)

    def truth(self, y: np.ndarray) -> np.ndarray:
        return (y > 0.5).astype(np.uint8)

    def correct(self, logits: Any, y: Any, fused: bool) -> Any:
        """Each row counts the share of its labels predicted right (Keras's binary_accuracy)."""
        return ((logits > (0.0 if fused else 0.5)) == (y > 0.5)).sum() / y.shape[1]

    def report(self, truth: np.ndarray, predicted: np.ndarray, classes: list[Any]) -> dict[str, Any]:
        return multilabel_report(truth, predicted, classes)

    def onnx(self, g: Any, out: str, saved: Any, unread: str) -> None:
        """`probabilities` per label (NaN for a row predict refuses) and `labels`, 1 where one passes 0.5."""
        probs = g.op("Where", unread, g.const(float("nan"), "nan"), out)
        g.output(probs, "probabilities", g.onnx.TensorProto.FLOAT, ["N", len(saved.classes)])
        chosen = g.op("Cast", g.op("Greater", probs, g.const(np.float32(0.5), "half")), to=g.onnx.TensorProto.INT64)
        g.output(chosen, "labels", g.onnx.TensorProto.INT64, ["N", len(saved.classes)])

    def output_names(self, classes: list[Any], width: int, proba: bool) -> tuple[list[str], list[str]]:
        probs = [f"prob_{c}" for c in classes] if proba else []
        return (["prediction", *map(str, classes), *probs],
                ["text"] + ["int"] * len(classes) + ["float"] * len(probs))

    def rows(self, outputs: np.ndarray, classes: list[Any], proba: bool, digits: str) -> np.ndarray:
        """The predicted set (`|`-joined, as the training cells), then 0/1 per label (and probabilities)."""
        chosen = outputs.reshape(len(outputs), -1) > 0.5
        names = np.array([str(c) for c in classes], dtype=object)
        sets, inverse = np.unique(chosen, axis=0, return_inverse=True)  # each distinct set joined once
        joined = np.array([LABEL_SEPARATOR.join(names[s]) for s in sets], dtype=object)[inverse.reshape(-1)][:, None]
        parts = [joined, chosen.astype(np.int64).astype(str).astype(object)]
        return np.concatenate(parts + ([np.char.mod(digits, outputs).astype(object)] if proba else []), axis=1)


class Regression(TargetTask):
    declaration = DECLARATIONS["regression"]
    def encode(self, y: np.ndarray, classes: list[Any], source: str, rows: Any = None) -> np.ndarray:
        try:
            values = np.asarray(y, dtype=B.current().floatx)
        except ValueError:
            raise DataError(_text_targets(y, source, rows)) from None
        bad = ~np.isfinite(values.reshape(len(values), -1))
        if bad.any():
            first = int(np.argwhere(bad)[0][0])
            raise DataError(f"{source}: the target of data row {first + 1} is {values.reshape(len(values), -1)[first]} "
                            f"({int(bad.any(axis=1).sum())} non-finite target(s) in all): the loss would be NaN; "
                            "drop or fill those rows")
        return values.reshape(len(values), -1)

    def width(self, classes: list[Any], targets: int) -> int:
        return targets

    def width_reason(self, classes: list[Any], source: str, targets: int) -> str:
        return f"({source} has {targets} regression target column(s))"

    def codes(self, y: np.ndarray) -> np.ndarray | None:
        return None

    def correct(self, logits: Any, y: Any, fused: bool) -> Any:
        return 0

    def onnx(self, g: Any, out: str, saved: Any, unread: str) -> None:
        """`prediction` in the data's units (NaN for a row predict refuses, or an infinite one)."""
        targets, nan = saved.targets, g.const(float("nan"), "nan")
        value = g.op("Add", g.op("Mul", out, g.const(targets.spread, "spread")), g.const(targets.shift, "shift")) \
            if targets.active else out
        value = g.op("Where", g.op("IsInf", value), nan, value)
        g.output(g.op("Where", unread, nan, value), "prediction", g.onnx.TensorProto.FLOAT, ["N", "targets"])

    def report(self, truth: np.ndarray, predicted: np.ndarray, classes: list[Any]) -> dict[str, Any]:
        return regression_report(truth, predicted)

    def output_names(self, classes: list[Any], width: int, proba: bool) -> tuple[list[str], list[str]]:
        names = ["prediction"] if width == 1 else [f"prediction_{i}" for i in range(width)]
        return names, ["float"] * width

    def rows(self, outputs: np.ndarray, classes: list[Any], proba: bool, digits: str) -> np.ndarray:
        return np.char.mod(digits, outputs.reshape(len(outputs), int(np.prod(outputs.shape[1:]))))


def _label_sets(y: np.ndarray) -> tuple[list[list[str]], np.ndarray]:
    """The distinct cells' labels (split at `|`, spaces around each trimmed, empty ones and repeats
    dropped) and each row's distinct cell."""
    uniques, inverse = np.unique(np.asarray(y).astype(str).reshape(-1), return_inverse=True)
    return [sorted({part.strip() for part in cell.split(LABEL_SEPARATOR)} - {""}) for cell in uniques], inverse.reshape(-1)


def table_task(loss_task: str, y: np.ndarray) -> str:
    """The task of a loss on these target cells: a binary loss on label sets (text cells, some holding
    the separator) is multi-label."""
    sets = y.dtype.kind in "OUS" and bool(np.char.find(np.asarray(y).astype(str), LABEL_SEPARATOR).max(initial=-1) >= 0)
    return resolved_task(loss_task, y.shape[1] if y.ndim == 2 else 1, sets).name


def _check_class_count(classes: int, rows: int, source: str) -> None:
    """More than MANY_CLASSES classes need at least ROWS_PER_CLASS rows each on average (a label per
    row or so is an identifier or a number, not a class: nothing to learn it from, and every class
    an output). Evaluation keeps each row's class, not its scores: no budget is needed for them."""
    if classes > MANY_CLASSES and classes * ROWS_PER_CLASS > rows:
        raise DataError(f"{source}: the target has {classes:,} classes in {rows:,} rows; with more than "
                        f"{MANY_CLASSES} classes a classifier needs at least {ROWS_PER_CLASS} rows per class on average "
                        "to learn them. Is data.target an identifier, or a number to predict (loss: mse)? Group rare "
                        "labels (data.label_map), or give more rows")


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def number_of(text: str) -> float | None:
    """A label's value when it is written as a number (so a key 2 matches the label 2.0)."""
    return float(text) if NUMBER.fullmatch(text.strip()) else None



def _text_targets(y: np.ndarray, source: str, rows: Any) -> str:
    """Why a regression cannot take these targets: labels (mostly text: the task is classification)
    or a few cells that are no number (named by row)."""
    uniques, inverse = np.unique(np.asarray(y).astype(str).ravel(), return_inverse=True)
    text = np.array([number_of(u) is None for u in uniques])
    bad = np.flatnonzero(text[inverse])
    if len(bad) * 2 > len(inverse):
        labels = ", ".join(repr(str(u)) for u in uniques[text][:5]) + (", ..." if text.sum() > 5 else "")
        if hint := looks_like(uniques[text]):  # amounts with signs, grouped thousands, dates: not labels
            return f"{source}: the regression target holds text ({labels}): {hint}"
        return (f"{source}: the target holds labels ({labels}), not numbers, but the loss is a regression loss: for "
                f"classes use loss: cross_entropy with a softmax output of one unit per class (or "
                f"binary_cross_entropy with one sigmoid unit for two)")
    first = int(bad[0])
    return (f"{source}: a regression target must be a number; data row {rows.row(first) if rows is not None else first + 1} has "
            f"{str(uniques[inverse[first]])!r} ({len(bad)} such row(s) in all): fix or drop those rows")
