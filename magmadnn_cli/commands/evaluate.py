"""`magmadnn evaluate`: a model's metrics (a file or its run folder alone, no config needed) on a
labelled file, read by the training readers and encoded by the model's own encoding, or on its run's
own held-out split, rebuilt from the saved config and seed. A file over half the memory budget (or any
file of a streamed model) is scored chunk by chunk in bounded memory, to the same numbers."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..data.metrics import report_sums
from ..data.prepare import Split, map_labels, rebuilt_split
from ..data.readers import Table, reader_for
from ..data.stream_prepare import over_budget
from ..data.table import with_targets
from ..data.targets import target_task
from ..errors import DataError, MagmaError
from ..files import file_sha256
from ..inference import Predictor, new_tally, read_spec, tally_notes
from ..inference.encoding import encode, refuse_non_finite_outputs
from ..inference.image_rows import count_missed, input_chunks, read_input, undecoded_note
from ..training.evaluation import evaluate_split, split_report
from ..training.modelfile import SavedModel
from ..training.run_folder import RunFolder

Warn = Callable[[str], None]
EVALUATE_CHUNK_ROWS = 65536  # rows a streamed evaluation holds at a time


def evaluate_model(model_path: Path, data_path: Path | None, device: str = "auto", split: str | None = None,
             strict: bool = False, warn: Warn | None = None) -> dict[str, Any]:
    """Metrics of a model (a file or a run folder) on a labelled file, or (`split`) on the held-out
    split of its own run."""
    if (data_path is None) == (split is None):
        raise MagmaError("give a data file to score, or --split test|validation|train to score the run's own split "
                         "(one of them)")
    if split is not None and split not in ("test", "validation", "train"):
        raise MagmaError(f"--split: expected test, validation or train; received {split!r}")
    model = Predictor(RunFolder.model_file(model_path), device)
    with model.using():
        return _evaluate(model, data_path, split, strict, warn)


def _evaluate(model: Predictor, data_path: Path | None, split: str | None, strict: bool,
              warn: Warn | None) -> dict[str, Any]:
    saved, model_path, network = model.saved, model.path, model.network
    if split is not None:
        data, source = _run_split(saved, model_path, split), f"{saved.config.data.train} ({split} split of the run)"
    else:
        spec = replace(read_spec(data_path, saved, True), target_fix=(
            "; evaluate needs the true values to score the model against. To predict without them: "
            f"magmadnn predict {shlex.quote(str(model_path))} {shlex.quote(str(data_path))}"))
        if streams_evaluation(data_path, saved):
            return _evaluate_streamed(model, data_path, spec, strict, warn)
        read, tally = read_input(data_path, spec), new_tally()
        table = read.table
        count_missed(tally, read)
        x = encode(table, saved, strict, tally)
        for note in (*table.notes, *_notes(tally, model, data_path)) if warn else ():
            warn(note)
        y = map_labels(table.y, saved.config.data.label_map)
        data = Split(x, saved.targets(target_task(saved.task).encode(y, saved.classes, str(data_path), table.raw)))
        source = str(data_path)
    rows = (lambda i: [int(r) + 1 for r in i]) if split is not None else (lambda i: [table.raw.row(int(r)) for r in i])
    with np.errstate(all="ignore"):  # non-finite outputs are refused by row, not left to numpy's warnings
        report = split_report(network, data, saved.classes, saved.task,
                              batch_size=saved.config.training.eval_batch_size, targets=saved.targets,
                              check=lambda out: refuse_non_finite_outputs(out, rows, source, model_path, saved))
    return {"model": str(model_path), "data": source, "rows": len(data.x), "task": saved.task, **report}


def streams_evaluation(data_path: Path, saved: SavedModel) -> bool:
    """Whether `evaluate` reads `data_path` in chunks: a table format read in chunks, and the model's
    data.stream is true or the file is over the memory budget (data.stream: auto's rule)."""
    if not reader_for(data_path).format.table or not data_path.is_file():  # a table: read in chunks
        return False
    return saved.config.data.stream is True or over_budget(data_path)


def _evaluate_streamed(model: Predictor, data_path: Path, spec: Any, strict: bool, warn: Warn | None) -> dict[str, Any]:
    """`_evaluate` on the file read chunk by chunk: each chunk encoded, run and added to the metrics'
    sums (`report_sums`), so memory holds one chunk whatever the file's size; the numbers are those
    of the whole file in memory (the loss up to the float rounding of other batch boundaries)."""
    saved, chunk_rows = model.saved, EVALUATE_CHUNK_ROWS
    sums, tally, notes, loss_sum, rows, chunks = report_sums(target_task(saved.task), saved.classes), new_tally(), \
        {}, 0.0, 0, 0
    for read in input_chunks(data_path, spec, chunk_rows):
        count_missed(tally, read)
        table = with_targets(read.table, spec, whole=False)  # rows without a target left out, as a whole read does
        notes.update(dict.fromkeys(table.notes))
        if not len(table.y):
            continue
        x = encode(table, saved, strict, tally)
        loss_sum, rows, chunks = loss_sum + _scored_chunk(model, table, x, sums, data_path), rows + len(x), chunks + 1
    if not rows:
        raise DataError(f"{data_path}: every row's target is missing (blank, NA, ?, ...); is it the file the model's "
                        f"target ({saved.config.data.target!r}) is in?")
    for note in (*notes, *_notes(tally, model, data_path),
                 f"{data_path}: evaluated in {chunks} chunk(s) of up to {chunk_rows:,} rows (larger than half the "
                 "memory available, or the model's data.stream: true)") if warn else ():
        warn(note)
    return {"model": str(model.path), "data": str(data_path), "rows": rows, "task": saved.task,
            "loss": loss_sum / max(1, rows), **sums.report()}


def _notes(tally: dict[str, Any], model: Predictor, data_path: Path) -> list[str]:
    """What reading and encoding the file did unasked, and whether it is the training file."""
    saved = model.saved
    return [n for n in (*tally_notes(tally, saved, str(data_path)),
                        undecoded_note(tally, saved.config.data.image, str(data_path), "not scored"),
                        training_file_note(saved, model.path, data_path)) if n]


def _scored_chunk(model: Predictor, table: Table, x: np.ndarray, sums: Any, data_path: Path) -> float:
    """One chunk's rows run and added to `sums` as `split_report` scores them; returns its loss sum."""
    saved, rule = model.saved, target_task(model.saved.task)
    y = saved.targets(rule.encode(map_labels(table.y, saved.config.data.label_map), saved.classes, str(data_path),
                                  table.raw))
    with np.errstate(all="ignore"):
        result = evaluate_split(model.network, Split(x, y), saved.task, batch_size=saved.config.training.eval_batch_size)
    rows = lambda i: [table.raw.row(int(r)) for r in i]  # noqa: E731
    if rule.decl.labels:
        refuse_non_finite_outputs(np.where(result["finite"], 0.0, np.nan)[:, None], rows, str(data_path), model.path,
                                  saved)
        sums.add(rule.truth(y), result["classes"])
    else:
        outputs = saved.targets.restore(result["outputs"])
        refuse_non_finite_outputs(outputs, rows, str(data_path), model.path, saved)
        sums.add(saved.targets.restore(y), outputs)
    return result["loss"] * len(x)


def training_file_note(saved: SavedModel, model_path: Path, data_path: Path) -> str | None:
    """A warning when `data_path` is the very file the model was trained on (its file_sha256)."""
    recorded = saved.metrics.get("data_sha256")
    if recorded is None or recorded != file_sha256(data_path):
        return None
    cfg = saved.config.data
    held = next((name for name, kept in (("test", cfg.test_split > 0 or cfg.test),
                                         ("validation", cfg.validation_split > 0 or cfg.validation)) if kept), None)
    way = (f"`magmadnn evaluate {shlex.quote(str(model_path))} --split {held}` scores the run's held-out {held} rows"
           if held else "the run held out no rows to score (data.validation_split, data.test_split)")
    return (f"{data_path} is the file this model was trained on: its rows include the training rows, so these "
            f"metrics overstate how it does on new data; {way}")


def _run_split(saved: SavedModel, model_path: Path, split: str) -> Split:
    """The run's own split, rebuilt from its saved config and seed; the data must be unchanged."""
    cfg = saved.config.data
    if cfg.synthetic is None:
        recorded = saved.metrics.get("data_sha256")
        if recorded is None:
            raise MagmaError(f"{model_path}: the run recorded no file_sha256 of its data (trained from a stream, or by "
                             "an older magmadnn); evaluate it on a file: magmadnn evaluate MODEL DATA")
        if file_sha256(cfg.train) != recorded:
            raise DataError(f"{cfg.train}: the file changed since the run (sha256 differs), so its {split} split "
                            "cannot be rebuilt; evaluate on a file instead: magmadnn evaluate MODEL DATA")
    chosen = rebuilt_split(cfg, saved.task, saved.config.run_seed, split, saved.encoder, saved.normalizer,
                           saved.targets)
    if chosen is None:
        held = [s for s in ("validation", "test") if s != split and (getattr(cfg, f"{s}_split") > 0 or getattr(cfg, s))]
        raise MagmaError(f"{model_path}: the run had no {split} split (data.{split}_split is 0); "
                         + (f"--split {held[0]} scores its held-out {held[0]} rows" if held else
                            "it held out no rows: score a file instead, magmadnn evaluate MODEL DATA"))
    return chosen
