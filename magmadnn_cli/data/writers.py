"""Writing rows by the output file's suffix: CSV (the default, and for stdout), TSV, Parquet, Feather /
Arrow IPC or JSON Lines. Rows arrive as text chunks (what a CSV holds); the typed formats give each
column its type (int, float or text) once for the whole file, so every chunk agrees."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterable

import numpy as np

from ..config.names import FORMATS, or_list
from ..errors import DataError
from .columnar import PACKED, SUFFIXES

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # CSV and JSON Lines are written without it
    pa = None

@dataclass(frozen=True)
class Columns:
    """The output's column names and kinds (int, float or text)."""
    names: list[str]
    kinds: list[str]


TEXT_SUFFIXES = (".csv", ".txt", ".tsv")


def output_format(path: Path | None) -> str:
    """csv (stdout: None; .csv, .txt, a name without a suffix), tsv, parquet, feather or jsonl by the
    name's suffix (text formats also compressed); another suffix is refused, not written as CSV."""
    name = path.name.lower() if path is not None else ""
    kind = next((k for k, suffixes in SUFFIXES.items() if name.endswith(suffixes)), None)
    if kind is not None:
        return kind
    stem = name.removesuffix(next((p for p in PACKED[1:] if name.endswith(p)), ""))
    if stem.endswith(".tsv"):
        return "tsv"
    if path is None or stem.endswith(TEXT_SUFFIXES) or "." not in stem.lstrip("."):
        return "csv"
    packed, unpacked = name[len(stem):], [FORMATS[kind] for kind in SUFFIXES if not FORMATS[kind].packed]
    what = f"{Path(stem).suffix}{packed} ({' and '.join(f.description for f in unpacked)} compress inside the file)" \
        if packed and Path(stem).suffix in {s for f in unpacked for s in f.suffixes} else repr(Path(stem).suffix + packed)
    raise DataError(f"--output {path}: no output format is written as {what}; name the file {_written()}")


def _written() -> str:
    """The names written, from the readers' declarations: '.csv, .tsv, .parquet, .feather or .jsonl (CSV
    text and JSON Lines also .gz, .bz2, .xz)'."""
    kinds = [FORMATS["csv"], *(FORMATS[kind] for kind in SUFFIXES)]
    packed = " and ".join(f.description for f in kinds if f.packed)
    names = [kinds[0].suffixes[0], ".tsv", *(f.suffixes[0] for f in kinds[1:])]  # tsv: CSV's tab-separated form
    return f"{or_list(names)} ({packed} also {', '.join(PACKED[1:])})"


def _csv(f: IO[bytes], columns: Columns, chunks: Iterable[np.ndarray], delimiter: str = ",") -> None:
    text = io.TextIOWrapper(f, encoding="utf-8", newline="", write_through=True)
    try:
        writer = csv.writer(text, delimiter=delimiter, lineterminator="\n")
        writer.writerow(columns.names)
        for chunk in chunks:
            writer.writerows(chunk.tolist())
        text.flush()
    finally:
        text.detach()  # leave the underlying file (maybe stdout) open


def _json_cells(cells: np.ndarray, kind: str) -> np.ndarray:
    """A column's cells as JSON values: numbers as written, text quoted (once per distinct value), a
    cell without a value (None: no prediction) null."""
    text = cells.astype(str)
    absent = _absent(cells, text)
    if kind != "text":
        values = text
    else:
        uniques, inverse = np.unique(text, return_inverse=True)
        values = np.array([json.dumps(u, ensure_ascii=False) for u in uniques], dtype=object)[inverse.ravel()]
    return np.where(absent, "null", values).astype(str) if absent.any() else values.astype(str)


def _absent(cells: np.ndarray, text: np.ndarray) -> np.ndarray:
    """Which cells hold no value (None: a row without a prediction; CSV writes them empty), `text`
    the cells as str (None: 'None', compared first: fast)."""
    absent = text == "None"
    if absent.any() and cells.dtype == object:
        absent[absent] = np.equal(cells[absent], None)
    return absent & (cells.dtype == object)


def _jsonl(f: IO[bytes], columns: Columns, chunks: Iterable[np.ndarray]) -> None:
    keys = [json.dumps(name, ensure_ascii=False) + ": " for name in columns.names]
    for chunk in chunks:
        lines = np.full(len(chunk), "{", dtype=object)
        for j, (key, kind) in enumerate(zip(keys, columns.kinds)):
            lines = lines + (", " if j else "") + key + _json_cells(chunk[:, j], kind).astype(object)
        f.write(("}\n".join(lines.tolist()) + "}\n").encode("utf-8") if len(lines) else b"")


def _arrow_type(kind: str) -> "pa.DataType":
    return {"int": pa.int64(), "float": pa.float64(), "text": pa.string()}[kind]


def _batch(chunk: np.ndarray, columns: Columns, schema: "pa.Schema") -> "pa.RecordBatch":
    arrays = [_arrow_column(chunk[:, j], kind) for j, kind in enumerate(columns.kinds)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _arrow_column(cells: np.ndarray, kind: str) -> "pa.Array":
    """A column's text cells typed; a cell without a value (None) null."""
    text = cells.astype(str)
    return pa.array(text, pa.string(), mask=_absent(cells, text)).cast(_arrow_type(kind))


def _typed(open_writer: Callable[[IO[bytes], "pa.Schema"], object]) -> Callable[..., None]:
    def write(f: IO[bytes], columns: Columns, chunks: Iterable[np.ndarray]) -> None:
        schema = pa.schema([(n, _arrow_type(k)) for n, k in zip(columns.names, columns.kinds)])
        writer = open_writer(f, schema)
        try:
            for chunk in chunks:
                writer.write_batch(_batch(chunk, columns, schema))
        finally:
            writer.close()
    return write


WRITERS = {"csv": _csv, "tsv": lambda f, columns, chunks: _csv(f, columns, chunks, "\t"), "jsonl": _jsonl}
if pa is not None:
    WRITERS["parquet"] = _typed(lambda f, schema: pq.ParquetWriter(f, schema))
    WRITERS["feather"] = _typed(lambda f, schema: pa.ipc.new_file(f, schema))


COMPRESSORS = {".gz": lambda f: gzip.GzipFile(fileobj=f, mode="wb", mtime=0), ".bz2": lambda f: bz2.BZ2File(f, "wb"),
               ".xz": lambda f: lzma.LZMAFile(f, "wb")}


def write_rows(f: IO[bytes], path: Path | None, columns: Columns, chunks: Iterable[np.ndarray]) -> None:
    """Text row chunks (rows x columns) written to `f` in the format `path`'s suffix names (CSV for
    None: stdout), compressed for .gz, .bz2 or .xz (CSV and JSON Lines)."""
    packer = COMPRESSORS.get(path.suffix.lower()) if path is not None else None
    kind = output_format(path)
    if packer is None or kind in ("parquet", "feather"):
        WRITERS[kind](f, columns, chunks)
        return
    with packer(f) as packed:
        WRITERS[kind](packed, columns, chunks)
