"""Encoding rows for a saved model: a table's cells as the network's inputs through the model's own
column encoding (categories, booleans, missing cells) and normalization, with every check training makes
(infinite cells, normalization overflow, unseen categories and missing cells counted or refused), and the
check on what comes out (non-finite outputs named by row)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..data.classes import add_unseen, unseen_note
from ..data.fitting import column_strategy, fill_name
from ..data.image_column import image_columns
from ..data.prepare import encode_features
from ..data.readers import ReadSpec, Table, reader_for
from ..errors import DataError, ModelFileError
from ..training.modelfile import SavedModel


def read_spec(path: Path, saved: SavedModel, need_target: bool, keep: tuple[str, ...] = ()) -> ReadSpec:
    """How to read `path` for this model: its feature columns, the training file's encoding and
    column names (data.names: a file with or without that header row)."""
    return ReadSpec.of(saved.config.data, need_target, saved.features, keep, features_from="the model")


def extra_columns(path: Path, spec: ReadSpec, saved: SavedModel) -> list[str]:
    names = reader_for(path).columns
    if names is None:
        return []
    known = set(saved.features) | set(saved.config.data.target_columns) | set(spec.keep) | set(image_columns(spec))
    return [n for n in names(path, spec) if n not in known]


def encode(table: Table, saved: SavedModel, strict: bool, tally: dict[str, Any]) -> np.ndarray:
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


def fill_of(saved: SavedModel, name: str) -> str:
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
               f"--strict refuses them (without --strict it is filled as in training: {fill_of(saved, name)})")
        raise DataError(f"{table.source}: column {name!r}, data row {raw.row(raw.first(masks[name]))}: a missing "
                        f"cell; {why}")
    for name, mask in masks.items():
        tally["filled"][name] = tally["filled"].get(name, 0) + int(mask.sum())
    inputs = [c.name for c in saved.encoder.inputs()]
    if inputs and all(name in masks for name in inputs):  # rows of blanks (a spreadsheet's trailing rows)
        empty = np.flatnonzero(np.logical_and.reduce([masks[name] for name in inputs]))
        tally["empty"] += [raw.row(int(i)) for i in empty[:EMPTY_SHOWN - len(tally["empty"])]]
        tally["empty_rows"] += len(empty)


EMPTY_SHOWN = 5  # rows of blanks named by number


def new_tally() -> dict[str, Any]:
    """What encoding rows counts (`_inputs`): rows, unseen categories and filled cells by column, and
    the rows of blanks (the first EMPTY_SHOWN by number, and how many); what reading them counts
    (`image_rows.count_missed`): the input rows, and those whose image could not be decoded."""
    return {"rows": 0, "unseen": {}, "filled": {}, "empty": [], "empty_rows": 0, "input_rows": 0, "undecoded": 0,
            "undecoded_files": []}


def tally_notes(tally: dict[str, Any], saved: SavedModel, source: str) -> list[str]:
    """What encoding the rows did unasked: categories unseen in training zeroed, missing cells filled."""
    filled = tally["filled"]
    note = (f"{source}: missing cells filled as in training: "
            f"{', '.join(f'{name} ({n}: {fill_of(saved, name)})' for name, n in filled.items())} (--strict refuses "
            "them)") if filled else None
    empty = (f"{source}: {tally['empty_rows']} row(s) hold no feature at all, every cell missing (data rows "
             f"{', '.join(map(str, tally['empty']))}{', ...' if tally['empty_rows'] > len(tally['empty']) else ''}): "
             "their predictions come from the training fills alone, one answer for all; leave such rows out (a "
             "spreadsheet's empty rows?)") if tally["empty_rows"] else None
    return [n for n in (unseen_note(tally["unseen"], source, saved.encoder), note, empty) if n]


def _first_bad(bad: np.ndarray, table: Table) -> tuple[int, int, int] | None:
    """(row index, column, rows) of the first row in file order holding a True of `bad`, or None."""
    bad = bad.reshape(len(bad), int(np.prod(bad.shape[1:])))  # (a table of no rows too)
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


def refuse_non_finite_outputs(outputs: np.ndarray, data_rows: Callable[[np.ndarray], list[int]], source: str,
                               model_path: Path, saved: SavedModel) -> None:
    """Outputs that are inf or NaN although the inputs are finite: the model's own computation
    overflowed (weights too large for its precision). Refused, naming the rows."""
    bad = ~np.isfinite(outputs.reshape(len(outputs), int(np.prod(outputs.shape[1:])))).all(axis=1)
    if not bad.any():
        return
    rows = data_rows(np.flatnonzero(bad)[:5])
    largest = max((float(np.abs(w).max()) for w in saved.weights.values() if w.size), default=0.0)
    raise ModelFileError(f"{model_path}: the model's computation overflowed ({saved.config.precision}) to infinity "
                         f"or NaN on {int(bad.sum())} of {len(bad)} row(s) of {source} (data row(s) "
                         f"{', '.join(map(str, rows))}{', ...' if bad.sum() > len(rows) else ''}): its weights "
                         f"(largest magnitude {largest:.3g}) are too large for its precision. Retrain the model (a "
                         "smaller learning rate, weight_decay), or use precision: float64")
