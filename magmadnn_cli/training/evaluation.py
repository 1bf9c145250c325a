"""Evaluation as a plain function over a network and data, used by train, evaluate and tune alike."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..core import backend as B
from ..data.prepare import Split, TargetScaler
from ..distributed import Communicator, SingleProcess
from .metrics import classification_report, predicted_classes, regression_report

CACHED_BATCH_BYTES = 8 << 20  # CPU: a batch's activations past this leave the caches (LeNet-5 at 1,024 rows: 6x the time a row)


def inference_rows(network: Any, batch_size: int) -> int:
    """Rows per inference batch: `training.eval_batch_size`, on the CPU at most what keeps a batch's
    layer outputs within CACHED_BATCH_BYTES (a GPU takes the whole batch)."""
    if B.current().device != "cpu" or not getattr(network, "activation_size", 0):
        return batch_size
    row = network.activation_size * np.dtype(B.current().floatx).itemsize
    return max(1, min(batch_size, CACHED_BATCH_BYTES // row))


def inference_batches(network: Any, start: int, stop: int, batch_size: int) -> list[slice]:
    """Rows start..stop in even batches (no small last one) of at most `inference_rows` rows."""
    rows = stop - start
    count = math.ceil(rows / inference_rows(network, batch_size))
    edges = [start + rows * i // count for i in range(count + 1)] if count else []
    return [slice(lo, hi) for lo, hi in zip(edges, edges[1:])]


def evaluate(network: Any, split: Split, task: str, comm: Communicator | None = None,
             batch_size: int = 1024) -> dict[str, Any]:
    """Loss and accuracy over a split in eval mode, the rows sharded over ranks; sums are reduced,
    so the result is exact on any rank count. Also returns every row's output (gathered, in order)
    as `outputs`."""
    comm = comm or SingleProcess()
    rows = len(split.x)
    parts = inference_batches(network, rows * comm.rank // comm.size, rows * (comm.rank + 1) // comm.size, batch_size)
    _check_memory(network, rows, parts[0].stop - parts[0].start if parts else 0)
    loss_sum, outputs = 0.0, []
    for part in parts:
        loss, out = network.loss_and_output(B.to_device(split.x[part]), B.to_device(split.y[part]))
        loss_sum += float(loss) * (part.stop - part.start)
        outputs.append(B.to_host(out))
    sums = B.current().xp.asarray([loss_sum], dtype=np.float64)
    comm.allreduce_sum(sums)
    gathered = [o for chunk in comm.allgather(outputs) for o in chunk]
    output = np.concatenate(gathered) if gathered else np.zeros((0,), np.float32)
    result: dict[str, Any] = {"loss": float(sums[0]) / max(1, len(split.x)), "outputs": output}
    if task != "regression":
        truth = split.y.reshape(-1).astype(np.int64)
        result["accuracy"] = float((predicted_classes(output, task) == truth).mean())
    return result


def _check_memory(network: Any, rows: int, batch: int) -> None:
    """An evaluation batch's activations (`training.eval_batch_size` rows through every layer) and
    every row's outputs (kept, then gathered: twice) fit, before the first batch runs."""
    if not hasattr(network, "activation_size"):
        return
    itemsize = np.dtype(B.current().floatx).itemsize
    what = f"evaluating {rows:,} rows in batches of {batch:,} (training.eval_batch_size)"
    activations, outputs = batch * network.activation_size * itemsize, 2 * rows * math.prod(network.output_shape) * itemsize
    if B.current().device == "cpu":
        B.require_memory(activations + outputs, what, how="a batch's activations and every row's outputs")
    else:
        B.require_memory(activations, what, how="a batch's activations")
        B.require_memory(outputs, what, on_host=True, how="every row's outputs")


def split_report(network: Any, split: Split, classes: list[Any], task: str, comm: Communicator | None = None,
                 batch_size: int = 1024, targets: TargetScaler | None = None,
                 check: Callable[[np.ndarray], None] | None = None) -> dict[str, Any]:
    """Loss (of the scaled targets the network learns) plus the full metric set of one split
    (regression metrics in the data's own units); `check` sees every row's output first, in the
    data's units (and may refuse them, e.g. non-finite ones)."""
    result = evaluate(network, split, task, comm, batch_size)
    outputs = result.pop("outputs")
    restore = targets.restore if targets is not None and task == "regression" else (lambda v: v)
    if check is not None:
        check(restore(outputs))
    if task == "regression":
        result.update(regression_report(restore(split.y), restore(outputs)))
    else:
        truth = split.y.reshape(-1).astype(np.int64)
        result.update(classification_report(truth, predicted_classes(outputs, task), classes))
    return result
