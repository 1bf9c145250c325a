"""Input rows whose image cannot be decoded, for a model trained with data.image.on_error: skip: the
image readers leave them out of the table the model takes, so predict reads the rows first (an image
column's paths as cells, a folder's listing) and decodes them after, knowing which rows are left out;
it writes a row for each (its kept columns, no prediction), evaluate counts them, and both name the
first few files once, with why."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..config.data import ImageSettings
from ..data import image_cache
from ..data.image_column import image_columns, with_image_column
from ..data.image_decode import Decoding, decode_block
from ..data.image_folder import list_classes, list_images
from ..data.readers import ReadSpec, Table, reader_for

SHOWN = 3  # files left out named, with why


@dataclass
class InputRows:
    """A chunk of input rows as read: `table`, the rows the model takes; `kept`, every input row's kept
    columns; `decoded`, which input rows `table` holds (None: all of them); `missed`, the first SHOWN
    rows left out as (the file as the input names it, its path) and `left_out`, how many."""
    table: Table
    kept: dict[str, np.ndarray]
    decoded: np.ndarray | None = None
    missed: list[tuple[str, str]] = field(default_factory=list)
    left_out: int = 0

    def spread(self, rows: np.ndarray) -> np.ndarray:
        """Output rows of the decoded rows in their places among every input row's (None elsewhere: no
        value, an empty CSV cell, null in JSON Lines and Parquet)."""
        if self.decoded is None:
            return rows
        out = np.full((len(self.decoded), rows.shape[1]), None, dtype=object)
        out[self.decoded] = rows
        return out

    def __post_init__(self) -> None:
        """The reader's own line on the files skipped (its last note) left to `undecoded_note`, which
        says it once for every chunk, with the rows."""
        notes = self.table.notes
        if self.left_out and notes and "on_error: skip" in notes[-1]:
            self.table.notes = notes[:-1]


def input_chunks(path: Path, spec: ReadSpec, chunk_rows: int) -> Iterator[InputRows]:
    """The input's rows in chunks of at most `chunk_rows` (a folder of images: one), each knowing the
    rows whose image could not be decoded."""
    reader = reader_for(path)
    if reader.format.files:
        yield _files(path, spec)
        return
    named = _image_specs(spec)
    if named is None:
        yield from (InputRows(table, table.kept) for table in reader.chunks(path, spec, chunk_rows))
        return
    done = 0
    for raw in reader.chunks(path, named[1], chunk_rows):
        yield _decoded(raw, path, named[0], done, cached=False)  # chunks: in memory (image_column.imaged_chunks)
        done += len(raw.x)


def read_input(path: Path, spec: ReadSpec) -> InputRows:
    """The input read whole (`Reader.read`: rows without a target left out first), as `input_chunks`."""
    reader = reader_for(path)
    if reader.format.files:
        return _files(path, spec)
    named = _image_specs(spec)
    if named is None:
        table = reader.read(path, spec)
        return InputRows(table, table.kept)
    return _decoded(reader.read(path, named[1]), path, named[0], 0)


def _image_specs(spec: ReadSpec) -> tuple[ReadSpec, ReadSpec] | None:
    """For a table with an image column: the spec that reads it decoded (the column the feature, as the
    image reader's own), and the one that reads its paths as cells; None without one."""
    names = image_columns(spec)
    if not names or spec.data is None:
        return None
    named = replace(spec, features=[names[0]])
    columns = {k: v for k, v in spec.data.columns.items() if k != names[0]}
    return named, replace(named, data=spec.data.revised(columns=columns))


def _decoded(raw: Table, path: Path, spec: ReadSpec, start: int, cached: bool = True) -> InputRows:
    """A table of image paths (data rows `start`, ...) with its image column decoded, and which rows were
    left out (found by their row ids, which the decoded table carries)."""
    if raw.raw.row_ids is None:
        raw.raw.row_ids = np.arange(start, start + len(raw.x))
    ids, cells = raw.raw.row_ids, raw.raw.cells(0)
    table = with_image_column(raw, path, spec, cached)
    decoded = np.isin(ids, table.raw.row_ids)
    missed = [str(c).strip() for c in cells[~decoded][:SHOWN]]
    base = os.path.dirname(os.path.abspath(path))
    return InputRows(table, raw.kept, decoded, [(c, os.path.join(base, c)) for c in missed], int((~decoded).sum()))


def _files(path: Path, spec: ReadSpec) -> InputRows:
    """A folder of images (or one image file): every file listed, those decoded found by the paths the
    table keeps; the paths are kept for every row."""
    table = reader_for(path).read(path, spec)
    settings = spec.data.image if spec.data is not None else None
    if settings is None or settings.on_error != "skip":  # every file decoded, or refused
        return InputRows(table, table.kept)
    listing = list_classes(path) if spec.need_target else list_images(path)
    shown = np.array([str(path)] * len(listing.files) if path.is_file() else
                     image_cache.relative(listing.files, path), dtype=object)
    if len(table.kept["path"]) == len(shown):
        return InputRows(table, table.kept)
    decoded = np.isin(shown, table.kept["path"])
    missed = [(str(shown[i]), listing.files[i]) for i in np.flatnonzero(~decoded)[:SHOWN]]
    return InputRows(table, {"path": shown}, decoded, missed, int((~decoded).sum()))


def count_missed(tally: dict[str, Any], rows: InputRows) -> None:
    """Adds a chunk's rows and those left out (the first SHOWN named) to `tally` (`encoding.new_tally`)."""
    tally["input_rows"] += len(rows.decoded) if rows.decoded is not None else len(rows.table.x)
    tally["undecoded"] += rows.left_out
    tally["undecoded_files"] += rows.missed[:SHOWN - len(tally["undecoded_files"])]


def undecoded_note(tally: dict[str, Any], settings: ImageSettings | None, source: str, what: str) -> str | None:
    """The one line on the rows whose image could not be decoded (`what` became of them), the first
    files named with why (decoded again: few)."""
    count = tally["undecoded"]
    if not count:
        return None
    files = tally["undecoded_files"]
    whys = _whys([p for _, p in files], settings)
    shown = "; ".join(f"{name}: {why}" for (name, _), why in zip(files, whys))
    return (f"{source}: {count:,} of {tally['input_rows']:,} row(s) {what}: their image cannot be decoded (the model "
            f"was trained with data.image.on_error: skip): {shown}" + ("; ..." if count > len(files) else ""))


def _whys(paths: list[str], settings: ImageSettings | None) -> list[str]:
    """Why each file cannot be decoded, as the model decodes it."""
    settings = settings or ImageSettings()
    size = tuple(settings.size) if settings.size else (8, 8)
    how = Decoding((int(size[0]), int(size[1])), settings.color if settings.color != "auto" else "rgb",
                   settings.resize)
    failed = dict(decode_block(0, paths, how)[2])
    return [failed.get(i, "it decodes now (changed since it was read?)") for i in range(len(paths))]
