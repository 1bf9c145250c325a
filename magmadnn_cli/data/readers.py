"""Reading data: one reader registry (`READERS`: each format's declaration, `config/names.py` FORMATS, with
its read-whole and read-in-chunks functions) used by train, validate, evaluate, predict and summary, so
every format one command accepts, all accept. Formats: CSV text (any dialect, compressed or not; typed
columns with missing cells), Parquet, Feather / Arrow IPC and JSON Lines (`columnar`), NPZ (`x`, `y`),
MNIST IDX and CIFAR-10 batches, image folders and files; plus synthetic teacher-network data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..config.data import SyntheticData
from ..config.names import FORMATS, Format
from ..core import backend as B
from ..errors import DataError
from ..files import load_npz
from .arrow_csv import StreamFailed, read_typed, stream_cells
from .columnar import SUFFIXES, batch_table, column_names, columnar_chunks, read_columnar, sliced
from .cells import RawColumns
from .csv_reader import CsvFormat, csv_header, iter_csv_chunks, parse_cells, parse_rows
from .text_source import STDIN, check_file, is_stream
from .image_folder import is_image_file, read_image_folder
from .image_column import imaged, imaged_chunks
from .images import image_format, read_images
from .pixels import channels_first, settle_eight_bit
from .numbers import OffStyle, other_style_note, respelled_labels, two_way_note
from .json_records import json_refusal
from .table import ReadSpec, Table, check_finite, checked_columns, joined, labelled, typed_labels, whole_read

__all__ = ["READERS", "Reader", "ReadSpec", "Table", "read_table", "reader_for", "synthetic", "typed_labels"]


# -- CSV -----------------------------------------------------------------------------------------
ARROW_MAX_COLUMNS = 10_000  # wider files go to the line reader: pyarrow keeps ~13 KiB per column (3 s at 100,000)


def csv_chunks(path: Path, spec: ReadSpec, chunk_rows: int = 65536, whole: bool = False) -> Iterator[Table]:
    """The file's rows as Tables of at most `chunk_rows` rows (and about 8 Mi characters); `whole`:
    the caller keeps them all (`read_csv`), so their rows are counted against the memory budget.
    Streamed through pyarrow where it takes the file; the line reader reads the rest (or all)."""
    fmt = spec.csv_format(path)
    names = csv_header(path, fmt)
    wanted = checked_columns(path, names, spec)
    done = 0
    batches = None if whole or len(names) > ARROW_MAX_COLUMNS else \
        stream_cells(path, fmt, list(dict.fromkeys(wanted + [spec.target] * (spec.target in names) + list(spec.keep))))
    try:
        for part in sliced(batches or (), chunk_rows):
            yield batch_table(part, path, spec, wanted, spec.target if spec.target in names else None, done,
                              fmt.decimal, fmt.thousands)
            done += part.num_rows
        if batches is not None:
            return
    except (StreamFailed, OffStyle):
        pass  # the line reader goes on from row `done`, naming what pyarrow refused by file and line
    yield from _line_chunks(path, spec, fmt, names, wanted, chunk_rows, done, whole)


def _line_chunks(path: Path, spec: ReadSpec, fmt: CsvFormat, names: list[str], wanted: list[str], chunk_rows: int,
                 done: int, whole: bool) -> Iterator[Table]:
    """csv_chunks through the line reader, from data row `done` on."""
    position = {n: i for i, n in enumerate(names)}
    columns = [position[f] for f in wanted]
    text = spec.text_columns(wanted)
    dtype = spec.dtype or B.current().floatx
    target = spec.target if spec.target in position else None
    bound = whole_read(path, spec, len(wanted)) if whole else None
    skip, done = done, 0
    for first_line, lines in iter_csv_chunks(path, chunk_rows, fmt, bound=bound):
        cut = min(len(lines), max(0, skip - done))  # rows already streamed
        first_line, lines, done = first_line + cut, lines[cut:], done + cut
        if not lines:
            continue
        x, strings = parse_cells(lines, path, names, columns, first_line, fmt, dtype, text)
        y = parse_rows(lines, path, names, [position[target]], first_line, fmt, str)[:, 0] if target else None
        y = respelled_labels(y, fmt.decimal, fmt.thousands) if y is not None else None
        kept = parse_rows(lines, path, names, [position[k] for k in spec.keep], first_line, fmt, str) \
            if spec.keep else None
        yield spec.blanked(Table(RawColumns(x, strings, np.arange(done, done + len(x))), y, wanted, str(path),
                                 {k: kept[:, i] for i, k in enumerate(spec.keep)} if kept is not None else {}))
        done += len(x)


def read_csv(path: Path, spec: ReadSpec, fast: bool = True) -> Table:
    """The whole file: numeric feature columns through pyarrow when it takes them, else (text
    columns, anything unusual, or `fast` off) the line reader, chunk by chunk."""
    fmt = spec.csv_format(path)
    table = _read_fast(path, spec, fmt) if fast and set(spec.keep) <= set(spec.labels) else None  # kept: as written
    table = table or joined(list(csv_chunks(path, spec, whole=True)), spec, path)
    if note := other_style_note(path, fmt.style_seen, fmt.decimal, fmt.thousands):
        table.notes.append(note)
    if fmt.two_way:
        table.notes.append(two_way_note(path, list(fmt.two_way)))
    if fmt.style_detected:
        table.settled.update(decimal=fmt.decimal, thousands=fmt.thousands)
        table.notes.append(f"{path}: numbers are written with {fmt.decimal!r} as the decimal mark and "
                           f"{fmt.thousands!r} between thousands (detected; data.decimal and data.thousands set it)")
    return table


def _read_fast(path: Path, spec: ReadSpec, fmt: CsvFormat) -> Table | None:
    """The table through pyarrow's reader (None: the line reader's)."""
    names = csv_header(path, fmt)
    wanted = checked_columns(path, names, spec)
    if len(names) > ARROW_MAX_COLUMNS:
        return None
    target = spec.target if spec.need_target else None
    text = [wanted[j] for j in sorted(spec.text_columns(wanted))]
    arrow = read_typed(path, fmt, wanted, target, text, whole_read(path, spec, len(wanted) + len(spec.labels)),
                       spec.labels)
    if arrow is None:
        return None
    try:
        table = batch_table(arrow, path, spec, wanted, target, 0, fmt.decimal, fmt.thousands)
    except OffStyle:
        return None  # the line reader names the cell by file and line
    check_finite(table.x, path, wanted)
    table.y = respelled_labels(table.y, fmt.decimal, fmt.thousands) if table.y is not None else None
    return labelled(table, spec)


# -- NPZ and images ------------------------------------------------------------------------------
def read_npz(path: Path, spec: ReadSpec) -> Table:
    check_file(path)
    f = load_npz(path, ".npz file", DataError, keys=("x", "y"))
    if "x" not in f or (spec.need_target and "y" not in f):
        with np.load(path, allow_pickle=False) as archive:  # just its names (read a moment ago)
            held = sorted(archive.files)
        raise DataError(f"{path}: expected arrays 'x' and 'y'; the file holds {held or 'nothing'}")
    x, y = f["x"], f.get("y")
    if x.dtype.kind not in "biuf":
        raise DataError(f"{path}: x must be numeric; received dtype {x.dtype}")
    if x.ndim < 2 or len(x) == 0:
        raise DataError(f"{path}: x must have shape (samples, features...); received {x.shape}")
    x, layout = channels_first(x, path)
    if y is not None and (y.ndim == 0 or len(y) != len(x)):
        raise DataError(f"{path}: x has {len(x)} rows but y has " + (f"{len(y)}" if y.ndim else "shape () (one value)")
                        + "; they must have one row per sample")
    with np.errstate(over="ignore"):  # a value beyond the float type becomes inf, refused just below by cell
        x = x.astype(spec.dtype or B.current().floatx)
    flat = x.reshape(len(x), -1)
    check_finite(flat, path, [f"x[{i}]" for i in range(flat.shape[1])])
    table = Table(RawColumns(x), y, [f"x{i}" for i in range(flat.shape[1])], str(path), notes=[layout] if layout else [])
    settle_eight_bit(table.settled, f["x"].dtype, x.ndim, spec.data)
    unused = [f"data.{key} ({value})" for key, value in (("target", spec.target), ("features", spec.features)) if value]
    if unused and not spec.features_from:  # said when training reads it (not again for a model that was)
        table.notes.append(f"{path}: {' and '.join(unused)} ignored: an .npz has no columns to name; its arrays x "
                           "(the samples) and y (the targets) are read")
    return table


def read_image_set(path: Path, spec: ReadSpec) -> Table:
    x, y = read_images(path)
    table = Table(RawColumns(x.astype(spec.dtype or B.current().floatx, copy=False)), y,
                  [f"pixel{i}" for i in range(int(np.prod(x.shape[1:])))], str(path))
    settle_eight_bit(table.settled, x.dtype, x.ndim, spec.data)
    return table


def read_one_image(path: Path, spec: ReadSpec) -> Table:
    """One image file: something to predict on, never a data set to train or score on."""
    if spec.need_target:
        raise DataError(f"{path}: one image is not a data set: give the folder of class folders it belongs in "
                        "(data.train: train/, holding train/<class>/*.png)")
    return read_image_folder(path, spec)


# -- the registry --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reader:
    """One data format: its declaration (name, suffixes, description), how to read it whole, read it in
    chunks, and (tables) name its columns; `recognises`: a file it reads by more than its name."""
    format: Format
    read: Callable[[Path, ReadSpec], Table]
    chunks: Callable[[Path, ReadSpec, int], Iterator[Table]]
    columns: Callable[[Path, ReadSpec], list[str]] | None = None  # None: arrays, not named columns
    recognises: Callable[[Path], bool] | None = None

    @property
    def name(self) -> str:
        return self.format.name

    def matches(self, path: Path) -> bool:
        return self.format.matches(path) or (self.recognises is not None and self.recognises(path))


def _whole(read: Callable[[Path, ReadSpec], Table]) -> Callable[[Path, ReadSpec, int], Iterator[Table]]:
    return lambda path, spec, rows: iter([read(path, spec)])


READERS = (  # matched in FORMATS' order
    Reader(FORMATS["images"], read_image_set, _whole(read_image_set),
           recognises=lambda p: not is_stream(p) and p.exists() and image_format(p) is not None),
    Reader(FORMATS["npz"], read_npz, _whole(read_npz)),
    Reader(FORMATS["csv"], imaged(read_csv), imaged_chunks(csv_chunks),
           lambda p, spec: csv_header(p, spec.csv_format(p)), recognises=lambda p: str(p) == STDIN or is_stream(p)),
    *(Reader(FORMATS[kind], imaged(read_columnar), imaged_chunks(columnar_chunks), column_names) for kind in SUFFIXES),
    Reader(FORMATS["image_folder"], read_image_folder, _whole(read_image_folder),
           recognises=lambda p: not is_stream(p) and p.is_dir()),
    Reader(FORMATS["image_file"], read_one_image, _whole(read_one_image),
           recognises=lambda p: not is_stream(p) and p.is_file() and is_image_file(p)),
)


def style_note(path: Path, spec: ReadSpec) -> str | None:
    """For a CSV whose lines show another number style than the one it is read in: the warning."""
    if reader_for(path).name != "csv" or is_stream(path):
        return None
    fmt = spec.csv_format(path)
    return other_style_note(path, fmt.style_seen, fmt.decimal, fmt.thousands)


def reader_for(path: Path) -> Reader:
    for reader in READERS:
        if reader.matches(path):
            return reader
    check_file(path)
    if path.name.lower().endswith((".xlsx", ".xls", ".xlsm", ".ods", ".numbers")):
        raise DataError(f"{path}: a spreadsheet, which is not read: save the sheet as CSV (File > Save As > CSV) and "
                        "give the .csv")
    if path.name.lower().endswith(".json"):
        raise json_refusal(path)
    tables_first = sorted(READERS, key=lambda r: not r.format.table)
    raise DataError(f"{path}: unknown data format; expected " + "; ".join(r.format.hint() for r in tables_first))


def read_table(path: Path, spec: ReadSpec) -> Table:
    return reader_for(path).read(path, spec)


def synthetic(spec: SyntheticData, seed: int) -> Table:
    """Classification data labelled by a random teacher network (tanh hidden layer), plus noise."""
    B.require_memory(spec.samples * (spec.features * 12 + spec.classes * 16),
                     f"data.synthetic ({spec.samples:,} samples x {spec.features:,} features)", on_host=True)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(spec.samples, spec.features)).astype(B.current().floatx)
    w1 = rng.normal(size=(spec.features, spec.hidden)) / np.sqrt(spec.features)
    w2 = rng.normal(size=(spec.hidden, spec.classes)) / np.sqrt(spec.hidden)
    scores = np.tanh(x @ w1) @ w2 + spec.noise * rng.normal(size=(spec.samples, spec.classes))
    return Table(RawColumns(x), scores.argmax(axis=1), [f"x{i}" for i in range(spec.features)], "synthetic")
