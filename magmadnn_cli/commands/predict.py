"""`magmadnn evaluate` and `magmadnn predict`: from the model file alone, no config needed."""

from __future__ import annotations

import csv
import io
import os
import sys
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np

from ..core import backend as B
from ..data.csv_reader import CsvFormat, csv_header, detect, iter_csv_chunks, parse_rows
from ..data.tables import CSV_SUFFIXES, Split, encode_targets, read_npz, read_table
from ..errors import DataError
from ..files import atomic_write
from ..training.modelfile import SavedModel, load, restore
from ..training.evaluation import split_report


def _format(path: Path, saved: SavedModel) -> CsvFormat:
    """This file's dialect (sniffed: it need not be the training file's), in the model's encoding."""
    return detect(path, None, saved.config.data.encoding)


def _feature_columns(path: Path, saved: SavedModel, allow: set[str]) -> list[int]:
    names = csv_header(path, _format(path, saved))
    missing = [f for f in saved.features if f not in names]
    extra = [n for n in names if n not in saved.features and n not in allow]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing the model's feature column(s) {', '.join(missing[:10])}"
                         + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else ""))
        if extra:
            parts.append(f"unknown column(s) {', '.join(extra[:10])}")
        raise DataError(f"{path}: columns do not match the model: {'; '.join(parts)}")
    return [names.index(f) for f in saved.features]


def evaluate(model_path: Path, data_path: Path, device: str = "auto") -> dict[str, Any]:
    saved = load(model_path)
    B.select(device, saved.config.precision)
    network = restore(saved)
    target = saved.config.data.target
    if data_path.name.lower().endswith(CSV_SUFFIXES):
        _feature_columns(data_path, saved, {target} if target else set())
    table = read_table(data_path, target, saved.features, True, None, saved.config.data.encoding)
    x = saved.normalizer(table.x.reshape((len(table.x),) + saved.sample_shape))
    split = Split(x, encode_targets(table.y, saved.task, saved.classes, str(data_path)))
    report = split_report(network, split, saved.classes, saved.task, batch_size=saved.config.training.eval_batch_size)
    return {"model": str(model_path), "data": str(data_path), "rows": len(x), "task": saved.task, **report}


def _chunks(path: Path, saved: SavedModel, chunk_rows: int) -> Iterator[np.ndarray]:
    """Input rows in chunks; the columns are checked before the first chunk is asked for."""
    if path.name.lower().endswith(".npz"):
        return iter([read_npz(path, need_target=False).x.reshape((-1,) + saved.sample_shape)])
    target = saved.config.data.target
    columns = _feature_columns(path, saved, {target} if target else set())
    return _csv_chunks(path, saved, columns, chunk_rows)


def _csv_chunks(path: Path, saved: SavedModel, columns: list[int], chunk_rows: int) -> Iterator[np.ndarray]:
    fmt = _format(path, saved)
    names = csv_header(path, fmt)
    empty = True
    for first_line, lines in iter_csv_chunks(path, chunk_rows, fmt):
        rows = parse_rows(lines, path, names, columns, first_line, fmt)
        bad = ~np.isfinite(rows)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise DataError(f"{path}:{first_line + r}: column {saved.features[c]!r} is not finite ({rows[r, c]})")
        empty = False
        yield rows.reshape((-1,) + saved.sample_shape)
    if empty:
        raise DataError(f"{path}: the CSV has a header but no data rows")


def check_output(out: Path, inputs: tuple[Path, ...]) -> None:
    """An output may replace a regular file the user names, never a link, a device, a folder, or
    one of the command's own inputs."""
    if out.is_symlink():
        raise DataError(f"--output {out}: is a symbolic link; it is not replaced (give the real path, or - for stdout)")
    if out.exists() and not out.is_file():
        kind = "a folder" if out.is_dir() else "not a regular file (a device, pipe or socket)"
        raise DataError(f"--output {out}: is {kind}; give a file path, or - for stdout")
    for given in inputs:
        try:
            same = out.exists() and given.exists() and os.path.samefile(out, given)
        except OSError:
            same = False
        if same:
            raise DataError(f"--output {out}: is the command's own input {given}; writing it would destroy it")


def predict(model_path: Path, data_path: Path, out: Path | None, proba: bool = False, device: str = "auto",
            chunk_rows: int = 65536) -> int:
    """Write predictions as CSV (to `out`, atomically, or to stdout for None or `-`); returns the row
    count."""
    out = None if out is not None and str(out) == "-" else out
    if out is not None:
        check_output(out, (model_path, data_path))
    saved = load(model_path)
    B.select(device, saved.config.precision)
    network = restore(saved)
    labels = np.array(saved.classes, dtype=object)
    batch = saved.config.training.eval_batch_size
    header = ["prediction"] + ([f"prob_{c}" for c in saved.classes] if proba and saved.task != "regression" else [])
    if saved.task == "regression" and network.output_shape[-1] > 1:
        header = [f"prediction_{i}" for i in range(network.output_shape[-1])]
    count = 0
    chunks = _chunks(data_path, saved, chunk_rows)

    def write(f: IO[bytes]) -> None:
        nonlocal count
        text = io.TextIOWrapper(f, encoding="utf-8", newline="", write_through=True)
        try:
            writer = csv.writer(text, lineterminator="\n")
            writer.writerow(header)
            for x in chunks:
                x = saved.normalizer(x)
                out_rows = np.concatenate([B.to_host(network.predict(B.to_device(x[i:i + batch])))
                                           for i in range(0, len(x), batch)])
                writer.writerows(_rows(out_rows, saved.task, labels, proba))
                count += len(x)
            text.flush()
        finally:
            text.detach()  # leave the underlying file (maybe stdout) open

    if out is None:
        write(sys.stdout.buffer)
    else:
        atomic_write(out, write)
    return count


def _rows(outputs: np.ndarray, task: str, labels: np.ndarray, proba: bool) -> list[list[Any]]:
    if task == "regression":
        return outputs.reshape(len(outputs), -1).tolist()
    probs = np.concatenate([1 - outputs, outputs], axis=1) if task == "binary" else outputs
    predicted = labels[probs.argmax(axis=1)]
    if not proba:
        return [[p] for p in predicted]
    rounded = np.round(probs.astype(np.float64), 6)
    return [[p, *r] for p, r in zip(predicted, rounded.tolist())]
