"""A table column of image paths as the samples (Ludwig's image feature), declared
`data.columns.photo: image`: each cell a path relative to the table's folder (or absolute), decoded
as an image folder is (data.image: size, colours, resize, workers, on_error, the cache), the table's
other feature columns left out; a missing or unreadable image is named with its row and file."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..config.data import ImageSettings
from ..errors import DataError
from . import image_folder
from .columns import RawColumns
from .table import ReadSpec, Table


def image_columns(spec: ReadSpec) -> list[str]:
    """The columns data.columns declares `image`."""
    data = spec.data
    return [n for n in (data.columns if data is not None else {}) if data.column_spec(n).type == "image"]


def imaged(read: Callable[[Path, ReadSpec], Table]) -> Callable[[Path, ReadSpec], Table]:
    """A table reader whose tables have the image column declared in data.columns decoded."""
    return lambda path, spec: with_image_column(read(path, _named(spec)), path, _named(spec))


def imaged_chunks(chunks: Callable[..., Iterator[Table]]) -> Callable[..., Iterator[Table]]:
    """A chunked table reader whose chunks have the image column decoded (predict's bounded memory), in
    memory: each chunk is another listing of the same table, so cached each would be decoded over the
    last one's slot."""
    return lambda path, spec, *rest: (with_image_column(t, path, _named(spec), cached=False)
                                      for t in chunks(path, _named(spec), *rest))


def _named(spec: ReadSpec) -> ReadSpec:
    """A model's read names the image column, not the pixels the model was fitted on."""
    names = image_columns(spec)
    return replace(spec, features=[names[0]]) if names and spec.features_from else spec


def with_image_column(table: Table, path: Path, spec: ReadSpec, cached: bool = True) -> Table:
    """The table with its image column decoded into (N, C, H, W) samples (the table as it is where it
    has none); not `cached`: decoded in memory whatever data.image.cache says (a chunk of a table)."""
    names = image_columns(spec)
    if not names or table.x.ndim > 2:
        return table
    if len(names) > 1 or len(table.features) > 1:
        others = [n for n in table.features if n != names[0]]
        raise DataError(f"{path}: data.columns declares {names[0]!r} an image column, which is the sample itself; "
                        f"the other feature column(s) {', '.join(map(repr, (names[1:] or others)[:5]))} cannot go "
                        f"beside it: list data.features: [{names[0]}], or type the others ignore")
    files = _resolved(table, path)
    settings = (spec.data.image or ImageSettings()).revised(**({} if cached else {"cache": False}))
    listing = image_folder.Listing(files=files, labels=[""] * len(files))
    try:
        read = image_folder.decoded_listing(path, listing, settings, spec)
    except DataError as exc:
        raise _with_row(exc, table, files, names[0]) from None
    keep, x = read.keep, read.x
    out = Table(RawColumns(x, {}, table.raw.row_ids[keep] if table.raw.row_ids is not None else np.flatnonzero(keep)),
                table.y[keep] if table.y is not None else None, [f"pixel{i}" for i in range(int(np.prod(x.shape[1:])))],
                table.source,
                {k: v[keep] for k, v in table.kept.items()}, table.notes + read.notes, dict(table.settled))
    read.settle(out.settled, spec)
    return out


def _resolved(table: Table, path: Path) -> list[str]:
    """The column's paths, relative ones against the table's folder; a blank cell is refused by row."""
    cells = table.raw.cells(0)
    blank = np.flatnonzero(np.char.str_len(np.char.strip(cells.astype(str))) == 0)
    if len(blank):
        raise DataError(f"{path}: data row {table.raw.row(int(blank[0]))} has no image path in column "
                        f"{table.features[0]!r} ({len(blank)} blank cell(s) in all); fill or drop those rows")
    base = os.path.dirname(os.path.abspath(path))
    return [os.path.join(base, str(cell).strip()) for cell in cells]


def _with_row(exc: DataError, table: Table, files: list[str], column: str) -> DataError:
    """A file's error with the data row(s) that name it."""
    text = str(exc)
    for i, file in enumerate(files):
        if text.startswith(f"{Path(file)}:"):
            return DataError(f"{table.source}: data row {table.raw.row(i)}, column {column!r}: {text}")
    return exc
