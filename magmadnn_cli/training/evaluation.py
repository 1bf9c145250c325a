"""Evaluation as a plain function over a network and data, used by train, evaluate and tune alike."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..core import backend as B
from ..data.prepare import Split, TargetScaler
from ..distributed import Communicator, SingleProcess
from ..data.targets import target_task

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


def evaluate_split(network: Any, split: Split, task: str, comm: Communicator | None = None,
             batch_size: int = 1024, scores: bool = False) -> dict[str, Any]:
    """Loss and accuracy over a split in eval mode, the rows sharded over ranks; sums are reduced,
    so the result is exact on any rank count. Each batch's outputs are reduced as they come: a
    classifier's to each row's class (`classes`) and whether its outputs are finite (`finite`), so
    10,000 classes cost a row 9 bytes, not 40 kB; a regression's are kept (`outputs`, gathered in
    order), and so are a classifier's with `scores`."""
    comm = comm or SingleProcess()
    rows = len(split.x)
    parts = inference_batches(network, rows * comm.rank // comm.size, rows * (comm.rank + 1) // comm.size, batch_size)
    rule = target_task(task)
    keep = scores or not rule.decl.labels
    _check_memory(network, rows, parts[0].stop - parts[0].start if parts else 0, keep, rule)
    loss_sum, kept = 0.0, []
    for part in parts:
        loss, out = network.loss_and_output(B.to_device(split.x[part]), B.to_device(split.y[part]))
        loss_sum += float(loss) * (part.stop - part.start)
        out = B.to_host(out)
        kept.append(out if keep else (rule.predicted(out), np.isfinite(out.reshape(len(out), -1)).all(axis=1)))
    sums = B.current().xp.asarray([loss_sum], dtype=np.float64)
    comm.allreduce_sum(sums)
    gathered = [o for chunk in comm.allgather(kept) for o in chunk]
    result: dict[str, Any] = {"loss": float(sums[0]) / max(1, len(split.x))}
    if keep:
        result["outputs"] = np.concatenate(gathered) if gathered else np.zeros((0,), np.float32)
    else:
        result["classes"] = np.concatenate([c for c, _ in gathered]) if gathered else np.zeros(0, np.uint8)
        result["finite"] = np.concatenate([f for _, f in gathered]) if gathered else np.zeros(0, bool)
    if rule.decl.labels:
        classes = result["classes"] if not keep else rule.predicted(result["outputs"])
        result["accuracy"] = rule.accuracy(classes, rule.truth(split.y))
    return result


def _check_memory(network: Any, rows: int, batch: int, scores: bool, rule: Any) -> None:
    """An evaluation batch's activations (`training.eval_batch_size` rows through every layer) and
    what is kept of every row (its outputs, or its class and a flag; kept, then gathered: twice)
    fit, before the first batch runs."""
    if not hasattr(network, "activation_size"):
        return
    itemsize = np.dtype(B.current().floatx).itemsize
    what = f"evaluating {rows:,} rows in batches of {batch:,} (training.eval_batch_size)"
    kept = rule.predicted(np.zeros((1, *network.output_shape), np.float32)).nbytes + 1  # a row's prediction, flag
    per_row = math.prod(network.output_shape) * itemsize if scores else kept
    activations, outputs = batch * network.activation_size * itemsize, 2 * rows * per_row
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
    data's units (and may refuse them, e.g. non-finite ones); a classifier's rows are scored batch by
    batch, so `check` sees one value a row, NaN where the row's outputs are not finite."""
    result, rule = evaluate_split(network, split, task, comm, batch_size), target_task(task)
    if not rule.decl.labels:
        restore = targets.restore if targets is not None else (lambda v: v)
        outputs = restore(result.pop("outputs"))
        if check is not None:
            check(outputs)
        result.update(rule.report(restore(split.y), outputs, classes))
        return result
    predicted, finite = result.pop("classes"), result.pop("finite")
    if check is not None:
        check(np.where(finite, 0.0, np.nan)[:, None])
    result.update(rule.report(rule.truth(split.y), predicted, classes))
    return result
