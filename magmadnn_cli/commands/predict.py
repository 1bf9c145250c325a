"""`magmadnn predict`: from the model file (or its run folder) alone, no config needed. Input rows are
read by the same readers as training (every format), encoded by the model's own column encoding
(categories, booleans, missing cells) and normalization, and written in the training data's labels
or units (`inference.Predictor`)."""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..config.tasks import task_named
from ..data.readers import reader_for, style_note
from ..data.writers import Columns, output_format, write_rows
from ..errors import DataError, MagmaError
from ..files import atomic_write, check_output_file
from ..inference import Predictor, new_tally, read_spec, tally_notes
from ..inference.encoding import extra_columns
from ..inference.image_rows import InputRows, input_chunks, undecoded_note
from ..training.modelfile import SavedModel
from ..training.run_folder import RunFolder

Warn = Callable[[str], None]
IMAGE_PATH = ("path",)


class Written(int):
    """The rows `predict` wrote (an int), with how many of them hold no prediction (`unpredicted`:
    their image could not be decoded)."""
    unpredicted: int

    def __new__(cls, rows: int, unpredicted: int = 0) -> "Written":
        written = super().__new__(cls, rows)
        written.unpredicted = unpredicted
        return written

    @property
    def rows(self) -> int:
        return int(self)


def written(result: Written, out: Path) -> str:
    """The line after writing `out`: rows written, and how many had no prediction."""
    if not result.unpredicted:
        return f"wrote {result.rows} predictions to {out}"
    return (f"wrote {result.rows} rows to {out}: {result.rows - result.unpredicted} predictions, "
            f"{result.unpredicted} without one (an image that cannot be decoded)")


def predict(model_path: Path, data_path: Path, out: Path | None, proba: bool = False, device: str = "auto",
            chunk_rows: int = 65536, keep: tuple[str, ...] = (), strict: bool = False,
            warn: Warn | None = None, overwrite: bool = False) -> Written:
    """Write predictions of a model (a file or a run folder) as CSV (to `out`, atomically, or to stdout
    for None or `-`), one row per input row, in order; returns the rows written. `keep` columns are
    copied in front of the predictions; an existing `out` is replaced only with `overwrite`. The first
    chunk is predicted before anything is written, so a mistake in it (--strict's unseen category)
    leaves stdout empty."""
    out = None if out is not None and str(out) == "-" else out
    model_path = RunFolder.model_file(model_path)
    if out is not None:
        check_output_file(out, (model_path, data_path), overwrite)
        output_format(out)  # a name no format is written as is refused before anything is read
    model = Predictor(model_path, device)
    if proba and not task_named(model.task).labels:
        raise MagmaError("--proba gives class probabilities; this is a regression model (drop --proba)")
    with model.using():
        _check_keep(keep, model.columns(proba).names)
        tally, chunks = new_tally(), _input_chunks(data_path, model.saved, tuple(keep), chunk_rows, warn)
        keep = (*IMAGE_PATH, *keep) if reader_for(data_path).format.files else tuple(keep)  # rows of files
        rows = (model.predict_rows(chunk, proba, keep, strict, tally) for chunk in chunks)
        first = next(rows, None)  # predicted before the header is written: its mistakes leave no output behind
        if first is None and warn:  # a header and no rows (a batch with nothing new): the header alone
            warn(f"{data_path}: no data rows; the output holds the header alone")
        _write(out, model.columns(proba, keep), itertools.chain([first] if first is not None else [], rows))
        notes = (*tally_notes(tally, model.saved, str(data_path)),
                 undecoded_note(tally, model.saved.config.data.image, str(data_path), "have no prediction"))
        for note in notes if warn else ():
            if note:
                warn(note)
        return Written(tally["input_rows"], tally["undecoded"])


def _write(out: Path | None, columns: Columns, rows: Iterator[np.ndarray]) -> None:
    """The output rows written to `out` (atomically) or to stdout (None)."""
    chunks = (np.asarray(chunk, dtype=object) for chunk in rows)
    if out is None:
        write_rows(sys.stdout.buffer, None, columns, chunks)
    else:
        atomic_write(out, lambda f: write_rows(f, out, columns, chunks))


def _input_chunks(data_path: Path, saved: SavedModel, keep: tuple[str, ...], chunk_rows: int,
                  warn: Warn | None) -> Iterator[InputRows]:
    """The input's rows in chunks, the first read (so its columns are checked) before anything is
    written; columns the model does not use are named once."""
    reader = reader_for(data_path)
    if keep and reader.columns is None:
        raise DataError(f"{data_path}: --keep copies a table's columns; this is {reader.name} data (arrays)")
    spec = read_spec(data_path, saved, False, keep)
    chunks = input_chunks(data_path, spec, chunk_rows)
    first = next(chunks, None)  # the header is checked against the model even where no row follows
    if first is None:
        return iter(())
    if warn and (note := style_note(data_path, spec)):
        warn(note)
    extra = extra_columns(data_path, spec, saved)
    if extra and warn:
        warn(f"{data_path}: ignoring {len(extra)} column(s) the model does not use: {', '.join(extra[:10])}"
             + (" ..." if len(extra) > 10 else ""))
    return itertools.chain([first], chunks)


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
