"""`magmadnn evaluate` and `magmadnn predict`: from the model file (or its run folder) alone, no config
needed. Input rows are read by the same readers as training (every format) and encoded by the model's
own column encoding (categories, booleans, missing cells), normalization and target scaling."""

from __future__ import annotations

import itertools
import shlex
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..core import backend as B
from ..data.classes import add_unseen, unseen_note
from ..data.prepare import Split, encode_features, encode_targets, map_labels, rebuilt_split
from ..data.fitting import column_strategy, fill_name
from ..data.tables import ReadSpec, Table, reader_for, style_note, typed_labels
from ..data.writers import Columns, output_format, write_rows
from ..errors import DataError, MagmaError, ModelFileError
from ..files import atomic_write, check_output_file, file_sha256
from ..training.builder import task_of
from ..training.evaluation import inference_batches, split_report
from ..training.modelfile import SavedModel, load, restore
from .run_dir import model_file

Warn = Callable[[str], None]


def _spec(path: Path, saved: SavedModel, need_target: bool, keep: tuple[str, ...] = ()) -> ReadSpec:
    """How to read `path` for this model: its feature columns, the training file's encoding and
    column names (data.names: a file with or without that header row)."""
    cfg = saved.config.data
    return ReadSpec(cfg.target if need_target else None, saved.features, need_target, cfg, B.current().floatx,
                    tuple(cfg.names) if cfg.names else None, keep, features_from="the model")


def _extra_columns(path: Path, spec: ReadSpec, saved: SavedModel) -> list[str]:
    names = reader_for(path).columns
    if names is None:
        return []
    known = set(saved.features) | {saved.config.data.target} | set(spec.keep)
    return [n for n in names(path, spec) if n not in known]


def _inputs(table: Table, saved: SavedModel, strict: bool, tally: dict[str, Any]) -> np.ndarray:
    """A table's rows as the network's normalized inputs; wrong widths named, expected vs got; cells
    that are infinite as read, or overflow the model's normalization, refused as training refuses them.
    Counts, per column, the unseen categories and the missing cells filled into `tally`."""
    _refuse_infinite_cells(table)
    x, unseen = encode_features(table, saved.encoder, strict)  # checks the width first
    _filled_cells(table, saved, strict, tally)
    add_unseen(tally["unseen"], unseen)
    width = int(np.prod(saved.sample_shape))
    got = int(np.prod(x.shape[1:]))
    if got != width:
        raise DataError(f"{table.source}: samples of {got} values {tuple(x.shape[1:])}; the model expects {width} "
                        f"{saved.sample_shape}")
    with np.errstate(all="ignore"):  # overflow is found below, by row and column
        normalized = saved.normalizer(x.reshape((len(x),) + saved.sample_shape))
    _refuse_normalization_overflow(x, normalized, table, saved)
    return normalized


def _fill_of(saved: SavedModel, name: str) -> str:
    """How training fills a column's missing cells, and with what: 'median 0.25', 'most frequent value 'blue'',
    'a category of its own '(missing)''."""
    column = next(c for c in saved.encoder.columns if c.name == name)
    value = f"{column.fill:.6g}" if isinstance(column.fill, float) else repr(column.fill)
    return f"{fill_name(_strategy(saved, name), column)} {value}"


def _strategy(saved: SavedModel, name: str) -> str:
    cfg, kind = saved.config.data, next(c.kind for c in saved.encoder.columns if c.name == name)
    return column_strategy(cfg.column_spec(name).missing, cfg.missing_values, kind)


def _filled_cells(table: Table, saved: SavedModel, strict: bool, tally: dict[str, Any]) -> None:
    """Counts into `tally`, per column, the missing cells filled as in training, and the rows that
    hold no feature at all; the first missing cell in file order is refused with --strict, or in a
    column the model takes complete only (data.missing_values: error)."""
    if table.x.ndim > 2 or saved.encoder.width == 0:
        return  # arrays: NaN is refused by encode_features
    masks, raw = saved.encoder.missing(table.raw), table.raw
    refused = [n for n in masks if strict or _strategy(saved, n) == "error"]
    if refused:
        name = min(refused, key=lambda n: raw.row(raw.first(masks[n])))
        why = ("the model was trained with missing cells refused (data.missing_values: error), so it takes complete "
               "rows only: fill the cell" if _strategy(saved, name) == "error" else
               f"--strict refuses them (without --strict it is filled as in training: {_fill_of(saved, name)})")
        raise DataError(f"{table.source}: column {name!r}, data row {raw.row(raw.first(masks[name]))}: a missing "
                        f"cell; {why}")
    for name, mask in masks.items():
        tally["filled"][name] = tally["filled"].get(name, 0) + int(mask.sum())
    inputs = [c.name for c in saved.encoder.columns if c.kind != "constant"]
    if inputs and all(name in masks for name in inputs):  # rows of blanks (a spreadsheet's trailing rows)
        empty = np.flatnonzero(np.logical_and.reduce([masks[name] for name in inputs]))
        tally["empty"] += [raw.row(int(i)) for i in empty[:EMPTY_SHOWN - len(tally["empty"])]]
        tally["empty_rows"] += len(empty)


EMPTY_SHOWN = 5  # rows of blanks named by number


def _new_tally() -> dict[str, Any]:
    """What encoding rows counts (`_inputs`): rows, unseen categories and filled cells by column, and
    the rows of blanks (the first EMPTY_SHOWN by number, and how many)."""
    return {"rows": 0, "unseen": {}, "filled": {}, "empty": [], "empty_rows": 0}


def _tally_notes(tally: dict[str, Any], saved: SavedModel, source: str) -> list[str]:
    """What encoding the rows did unasked: categories unseen in training zeroed, missing cells filled."""
    filled = tally["filled"]
    note = (f"{source}: missing cells filled as in training: "
            f"{', '.join(f'{name} ({n}: {_fill_of(saved, name)})' for name, n in filled.items())} (--strict refuses "
            "them)") if filled else None
    empty = (f"{source}: {tally['empty_rows']} row(s) hold no feature at all, every cell missing (data rows "
             f"{', '.join(map(str, tally['empty']))}{', ...' if tally['empty_rows'] > len(tally['empty']) else ''}): "
             "their predictions come from the training fills alone, one answer for all; leave such rows out (a "
             "spreadsheet's empty rows?)") if tally["empty_rows"] else None
    return [n for n in (unseen_note(tally["unseen"], source, saved.encoder), note, empty) if n]


def _first_bad(bad: np.ndarray, table: Table) -> tuple[int, int, int] | None:
    """(row index, column, rows) of the first row in file order holding a True of `bad`, or None."""
    bad = bad.reshape(len(bad), -1)
    rows = bad.any(axis=1)
    if not rows.any():
        return None
    first = table.raw.first(rows)
    return first, int(np.argmax(bad[first])), int(rows.sum())


def _refuse_infinite_cells(table: Table) -> None:
    """Infinite cells (inf, or a number beyond the model's float type, e.g. 1e300 in float32) are
    refused as training refuses them; an inf in would be a row of NaN out."""
    found = _first_bad(np.isinf(table.x), table)
    if found:
        row, column, count = found
        name = table.features[column] if column < len(table.features) else f"value {column + 1}"
        raise DataError(f"{table.source}: column {name!r}, data row {table.raw.row(row)}: "
                        f"{table.x.reshape(len(table.x), -1)[row, column]} is not a finite number (an infinity, or "
                        f"beyond the range of {table.x.dtype}, the model's precision); {count} row(s) hold such "
                        "values. Training refuses them too: clean or drop those rows")


def _refuse_normalization_overflow(x: np.ndarray, normalized: np.ndarray, table: Table, saved: SavedModel) -> None:
    """A finite input that the model's normalization ((x - shift) / spread) takes beyond its float type."""
    found = _first_bad(~np.isfinite(normalized), table)
    if found:
        row, column, count = found
        names = saved.encoder.output_names() if saved.encoder.columns else table.features
        name = names[column] if column < len(names) else f"input {column + 1}"
        norm = saved.normalizer
        scaled = f"x * {norm.scale:.4g}" if norm.scale != 1.0 else "x"
        raise DataError(f"{table.source}: column {name!r}, data row {table.raw.row(row)}: "
                        f"{x.reshape(len(x), -1)[row, column]:.6g} goes beyond the range of {normalized.dtype} in the "
                        f"model's input normalization (({scaled} - shift) / spread, shift {norm.shift[column]:.4g}, "
                        f"spread {norm.spread[column]:.4g}); "
                        f"{count} row(s) hold such values, far outside the data the model was trained on")


def _refuse_non_finite_outputs(outputs: np.ndarray, data_rows: Callable[[np.ndarray], list[int]], source: str,
                               model_path: Path, saved: SavedModel) -> None:
    """Outputs that are inf or NaN although the inputs are finite: the model's own computation
    overflowed (weights too large for its precision). Refused, naming the rows."""
    bad = ~np.isfinite(outputs.reshape(len(outputs), -1)).all(axis=1)
    if not bad.any():
        return
    rows = data_rows(np.flatnonzero(bad)[:5])
    largest = max((float(np.abs(w).max()) for w in saved.weights.values() if w.size), default=0.0)
    raise ModelFileError(f"{model_path}: the model's computation overflowed ({saved.config.precision}) to infinity "
                         f"or NaN on {int(bad.sum())} of {len(bad)} row(s) of {source} (data row(s) "
                         f"{', '.join(map(str, rows))}{', ...' if bad.sum() > len(rows) else ''}): its weights "
                         f"(largest magnitude {largest:.3g}) are too large for its precision. Retrain the model (a "
                         "smaller learning rate, weight_decay), or use precision: float64")


def evaluate(model_path: Path, data_path: Path | None, device: str = "auto", split: str | None = None,
             strict: bool = False, warn: Warn | None = None) -> dict[str, Any]:
    """Metrics of a model (a file or a run folder) on a labelled file, or (`split`) on the held-out
    split of its own run."""
    if (data_path is None) == (split is None):
        raise MagmaError("give a data file to score, or --split test|validation|train to score the run's own split "
                         "(one of them)")
    if split is not None and split not in ("test", "validation", "train"):
        raise MagmaError(f"--split: expected test, validation or train; received {split!r}")
    model_path = model_file(model_path)
    saved = load(model_path)
    with B.using(B.select(device, saved.config.precision)):
        return _evaluate(saved, model_path, data_path, split, strict, warn)


def _evaluate(saved: SavedModel, model_path: Path, data_path: Path | None, split: str | None, strict: bool,
              warn: Warn | None) -> dict[str, Any]:
    network = restore(saved, model_path)
    if split is not None:
        data, source = _run_split(saved, model_path, split), f"{saved.config.data.train} ({split} split of the run)"
    else:
        spec = replace(_spec(data_path, saved, True), target_fix=(
            "; evaluate needs the true values to score the model against. To predict without them: "
            f"magmadnn predict {shlex.quote(str(model_path))} {shlex.quote(str(data_path))}"))
        table = reader_for(data_path).read(data_path, spec)
        tally = _new_tally()
        x = _inputs(table, saved, strict, tally)
        if warn:
            for note in (*table.notes, *_tally_notes(tally, saved, str(data_path)),
                         training_file_note(saved, model_path, data_path)):
                if note:
                    warn(note)
        y = map_labels(table.y, saved.config.data.label_map)
        data = Split(x, saved.targets(encode_targets(y, saved.task, saved.classes, str(data_path), table.raw)))
        source = str(data_path)
    rows = (lambda i: [int(r) + 1 for r in i]) if split is not None else (lambda i: [table.raw.row(int(r)) for r in i])
    with np.errstate(all="ignore"):  # non-finite outputs are refused by row, not left to numpy's warnings
        report = split_report(network, data, saved.classes, saved.task,
                              batch_size=saved.config.training.eval_batch_size, targets=saved.targets,
                              check=lambda out: _refuse_non_finite_outputs(out, rows, source, model_path, saved))
    return {"model": str(model_path), "data": source, "rows": len(data.x), "task": saved.task, **report}


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
    chosen = rebuilt_split(cfg, task_of(saved.config), saved.config.seed or 0, split, saved.encoder, saved.normalizer,
                           saved.targets)
    if chosen is None:
        held = [s for s in ("validation", "test") if s != split and (getattr(cfg, f"{s}_split") > 0 or getattr(cfg, s))]
        raise MagmaError(f"{model_path}: the run had no {split} split (data.{split}_split is 0); "
                         + (f"--split {held[0]} scores its held-out {held[0]} rows" if held else
                            "it held out no rows: score a file instead, magmadnn evaluate MODEL DATA"))
    return chosen


def predict(model_path: Path, data_path: Path, out: Path | None, proba: bool = False, device: str = "auto",
            chunk_rows: int = 65536, keep: tuple[str, ...] = (), strict: bool = False,
            warn: Warn | None = None, overwrite: bool = False) -> int:
    """Write predictions of a model (a file or a run folder) as CSV (to `out`, atomically, or to stdout
    for None or `-`); returns the row count. `keep` columns are copied in front of the predictions; an
    existing `out` is replaced only with `overwrite`. The first chunk is predicted before anything is
    written, so a mistake in it (--strict's unseen category) leaves stdout empty."""
    out = None if out is not None and str(out) == "-" else out
    model_path = model_file(model_path)
    if out is not None:
        check_output_file(out, (model_path, data_path), overwrite)
        output_format(out)  # a name no format is written as is refused before anything is read
    saved = load(model_path)
    if proba and saved.task == "regression":
        raise MagmaError("--proba gives class probabilities; this is a regression model (drop --proba)")
    with B.using(B.select(device, saved.config.precision)):
        network = restore(saved, model_path)
        _check_keep(keep, _columns(saved, network, proba, ()).names)
        tally = _new_tally()
        rows = (_predicted_rows(table, network, saved, proba, keep, strict, tally, model_path)
                for table in _input_chunks(data_path, saved, tuple(keep), chunk_rows, warn))
        first = next(rows, None)  # predicted before the header is written: its mistakes leave no output behind
        if first is None and warn:  # a header and no rows (a batch with nothing new): the header alone
            warn(f"{data_path}: no data rows; the output holds the header alone")

        columns = _columns(saved, network, proba, keep)
        chunks = (np.asarray(chunk, dtype=object) for chunk in itertools.chain([first] if first is not None else [], rows))
        if out is None:
            write_rows(sys.stdout.buffer, None, columns, chunks)
        else:
            atomic_write(out, lambda f: write_rows(f, out, columns, chunks))
        for note in _tally_notes(tally, saved, str(data_path)) if warn else []:
            warn(note)
        return tally["rows"]


def _input_chunks(data_path: Path, saved: SavedModel, keep: tuple[str, ...], chunk_rows: int,
                  warn: Warn | None) -> Iterator[Table]:
    """The input's rows in chunks, the first read (so its columns are checked) before anything is
    written; columns the model does not use are named once."""
    reader = reader_for(data_path)
    if keep and reader.columns is None:
        raise DataError(f"{data_path}: --keep copies a table's columns; this is {reader.name} data (arrays)")
    spec = _spec(data_path, saved, False, keep)
    chunks = reader.chunks(data_path, spec, chunk_rows)
    first = next(chunks, None)  # the header is checked against the model even where no row follows
    if first is None:
        return iter(())
    if warn and (note := style_note(data_path, spec)):
        warn(note)
    extra = _extra_columns(data_path, spec, saved)
    if extra and warn:
        warn(f"{data_path}: ignoring {len(extra)} column(s) the model does not use: {', '.join(extra[:10])}"
             + (" ..." if len(extra) > 10 else ""))
    return itertools.chain([first], chunks)


def _predicted_rows(table: Table, network: Any, saved: SavedModel, proba: bool, keep: tuple[str, ...],
                    strict: bool, tally: dict[str, Any], model_path: Path) -> np.ndarray:
    """One chunk's output rows as text (kept columns first); counts rows, unseen categories and filled cells."""
    x = _inputs(table, saved, strict, tally)
    tally["rows"] += len(x)
    outputs = _outputs(network, x, saved)
    _refuse_non_finite_outputs(outputs, lambda i: [table.raw.row(int(r)) for r in i], table.source, model_path, saved)
    rows = _rows(outputs, saved, proba)
    return np.concatenate([np.stack([table.kept[k] for k in keep], axis=1), rows], axis=1) if keep else rows


def _check_keep(keep: tuple[str, ...], outputs: list[str]) -> None:
    """Kept columns are named once each, and not as an output column (a table with two 'prediction'
    columns: Parquet refuses to read it, JSON keeps one of them)."""
    twice = next((k for k, n in Counter(keep).items() if n > 1), None)
    if twice is not None:
        raise MagmaError(f"--keep {twice}: given twice; give each column once")
    clash = next((k for k in keep if k in outputs), None)
    if clash is not None:
        raise MagmaError(f"--keep {clash}: the output has a column of that name ({', '.join(outputs[:4])}); rename the "
                         "column in the file to keep it")


def _columns(saved: SavedModel, network: Any, proba: bool, keep: tuple[str, ...]) -> Columns:
    """The output's columns: kept ones (text), then the predictions: values (float), or the label
    (typed as the training labels) and with --proba a probability (float) per class."""
    if saved.task == "regression":
        width = network.output_shape[-1]
        names = ["prediction"] if width == 1 else [f"prediction_{i}" for i in range(width)]
        return Columns(list(keep) + names, ["text"] * len(keep) + ["float"] * width)
    labels = typed_labels(np.array([str(c) for c in saved.classes]))
    label = {"i": "int", "f": "float"}.get(labels.dtype.kind, "text")
    probs = [f"prob_{c}" for c in saved.classes] if proba else []
    return Columns(list(keep) + ["prediction"] + probs, ["text"] * len(keep) + [label] + ["float"] * len(probs))


def _outputs(network: Any, x: np.ndarray, saved: SavedModel) -> np.ndarray:
    batches = inference_batches(network, 0, len(x), saved.config.training.eval_batch_size)
    with np.errstate(all="ignore"):  # an overflow is refused by row (_refuse_non_finite_outputs), not warned raw
        outputs = np.concatenate([B.to_host(network.predict(B.to_device(x[part]))) for part in batches])
        return saved.targets.restore(outputs) if saved.task == "regression" else outputs


def _rows(outputs: np.ndarray, saved: SavedModel, proba: bool) -> np.ndarray:
    """Output rows as text: values and probabilities to the precision the model computes in (7
    significant digits for float32: a probability of 3e-9 stays one), labels as the training data
    spells them."""
    digits = "%.7g" if outputs.dtype == np.float32 else "%.15g"
    if saved.task == "regression":
        return np.char.mod(digits, outputs.reshape(len(outputs), -1))
    probs = np.concatenate([1 - outputs, outputs], axis=1) if saved.task == "binary" else outputs
    labels = np.array([str(c) for c in saved.classes], dtype=object)
    predicted = labels[probs.argmax(axis=1)][:, None]
    if not proba:
        return predicted
    return np.concatenate([predicted, np.char.mod(digits, probs).astype(object)], axis=1)
