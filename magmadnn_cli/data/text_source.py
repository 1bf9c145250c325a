"""Where a table's bytes come from: files, compressed files (.gz, .bz2, .xz) and streams read once
(stdin `-`, FIFOs), bounded by the memory budget as they arrive; the encoding a byte-order mark
declares; and a file in another format (ZIP, Parquet, a program) named as such."""

from __future__ import annotations

import bz2
import codecs
import csv
import functools
import gzip
import io
import lzma
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..core import backend as B
from ..errors import DataError

STDIN = "-"
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
DECOMPRESSORS = {".gz": gzip.GzipFile, ".bz2": bz2.BZ2File, ".xz": lzma.LZMAFile}


def is_stream(path: Path) -> bool:
    """`-` (stdin), a FIFO or a character device: data that can be read only once."""
    if str(path) == STDIN:
        return True
    try:
        return path.exists() and not path.is_file() and not path.is_dir()
    except OSError:
        return False


def refuse_streams(data: Any, ranks: int) -> None:
    """A stream (stdin, a FIFO) as `data`'s train, validation or test file is read once, by one process:
    refused where several ranks would each read the data (the others waited on it forever)."""
    paths = {f"data.{key}": getattr(data, key) for key in ("train", "validation", "test")}
    streams = [(key, path) for key, path in paths.items() if path is not None and is_stream(Path(path))]
    if streams and ranks > 1:
        key, path = streams[0]
        what = "stdin" if str(path) == STDIN else f"{path} (a pipe)"
        raise DataError(f"{key}: {what} can be read once, by one process, and this command runs {ranks} ranks, each "
                        "reading the data: save it to a file and give its path, or run one process")


def stream_bytes(path: Path) -> bytes:
    """A stream's bytes, read on first use and kept (one read per process: a pipe cannot be read
    again), so that every later reader (header, rows) sees them; bounded by half the memory budget
    (`ReadBound`). A failed read keeps nothing."""
    return _read_once(str(path))


@functools.lru_cache(maxsize=None)
def _read_once(key: str) -> bytes:
    bound = ReadBound(Path(key), stream=True)
    try:
        if key == STDIN:
            return bound.read_all(sys.stdin.buffer)
        with open(key, "rb") as f:
            return bound.read_all(f)
    except OSError as exc:
        raise DataError(f"{key}: cannot read: {exc.strerror or exc}") from exc


READ_BYTES = 1 << 20  # bytes per read of a stream or a compressed file: memory stays bounded while it inflates
PREPARE_COPIES = 4    # a whole table is held about this many times while read and prepared (table, split, normalized)


@dataclass
class ReadBound:
    """What reading a whole file may take, counted as its text arrives (streamed, inflated or read
    in chunks): the text at most half the memory budget, and its rows, parsed at `row_bytes` each
    and held PREPARE_COPIES times while prepared, at most the budget. Refuses the first chunk past
    either, so a gzip bomb costs what the budget allows, not what it inflates to."""
    path: Path
    row_bytes: int = 0     # bytes a parsed row takes (0: text only, for reads that are not kept whole)
    columns: int = 0       # the feature columns of a row (for the message)
    stream: bool = False
    budget: int = field(default_factory=lambda: B.host_memory_available() or 2**40)
    chars: int = 0
    rows: int = 0

    def add(self, chars: int, rows: int) -> None:
        self.chars, self.rows = self.chars + chars, self.rows + rows
        if self.chars > self.budget // 2:
            half, budget = B.gib(self.budget // 2), B.budget_text(self.budget)
            if self.stream:
                raise DataError(f"{self.path}: the stream holds more than {half}, half of the {budget}; write it to "
                                "a file, which is read in chunks")
            raise DataError(f"{self.path}: holds (or inflates to) more than {half} of text, half of the {budget}; "
                            "refused (a gzip bomb, or data too large for this machine)")
        need = self.rows * self.row_bytes * PREPARE_COPIES
        if need > self.budget:
            budget = B.budget_text(self.budget)
            raise DataError(f"{self.path}: holds (or inflates to) more than {self.rows:,} rows of {self.columns:,} "
                            f"columns, {self.row_bytes:,} bytes each once parsed: {B.gib(need)} as the data is "
                            f"prepared (about {PREPARE_COPIES} copies); {budget}. Refused (a gzip bomb, or data too "
                            "large for this machine): use fewer rows, or fewer columns (data.features)")

    def read_all(self, f: Any) -> bytes:
        """All of a binary file object's bytes, read (or inflated) READ_BYTES at a time, counted."""
        data = io.BytesIO()
        while chunk := f.read(READ_BYTES):
            self.add(len(chunk), chunk.count(b"\n"))
            data.write(chunk)
        return data.getvalue()


def stream_opened(path: Path) -> Any:
    """A stream's kept bytes as a binary file, inflated by its name's suffix (.gz, .bz2, .xz)."""
    raw: Any = io.BytesIO(stream_bytes(path))
    suffix = path.suffix.lower()
    if suffix not in DECOMPRESSORS:
        return raw
    return DECOMPRESSORS[suffix](fileobj=raw) if suffix == ".gz" else DECOMPRESSORS[suffix](raw)


def open_text(path: Path, encoding: str = "utf-8") -> TextIO:
    """Text of a file or stream, decompressed by its suffix; a UTF-8 byte-order mark is dropped."""
    encoding = "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding
    suffix = path.suffix.lower()
    if is_stream(path):
        return io.TextIOWrapper(stream_opened(path), encoding=encoding, newline="")
    if suffix in OPENERS:
        return io.TextIOWrapper(OPENERS[suffix](path, "rb"), encoding=encoding, newline="")
    return open(path, encoding=encoding, newline="")


def check_file(path: Path) -> None:
    if is_stream(path):
        return
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if path.is_dir():
        raise DataError(f"{path}: is a directory; expected a data file")


READ_ERRORS = (OSError, EOFError, gzip.BadGzipFile, lzma.LZMAError, zlib.error, csv.Error)


OTHER_FORMATS = (  # (signature, what the file is, the fix)
    (b"PK\x03\x04", "a ZIP archive (an .npz? a spreadsheet?)", "an .npz of arrays x and y is read under a .npz name; "
     "save a spreadsheet as CSV"),
    (b"PAR1", "a Parquet file", "name it .parquet"), (b"ARROW1", "an Arrow file", "name it .arrow or .feather"),
    (b"\x1f\x8b", "gzip-compressed", "name it .csv.gz"), (b"\x93NUMPY", "a NumPy .npy array", "save x and y in an .npz"),
    (b"\x7fELF", "a program", ""), (b"%PDF", "a PDF document", ""), (b"\x89HDF", "an HDF5 file", ""))


def binary_error(path: Path) -> DataError | None:
    """A file that starts with another format's signature, named as that format (its undecodable
    bytes would otherwise send the user to data.encoding); None where none matches."""
    if path.suffix.lower() in OPENERS:
        return None
    try:
        if is_stream(path):
            start = stream_bytes(path)[:8]  # kept: reading its start again costs nothing
        else:
            with open(path, "rb") as f:
                start = f.read(8)
    except (OSError, DataError):
        return None
    found = next(((kind, fix) for magic, kind, fix in OTHER_FORMATS if start.startswith(magic)), None)
    if found is None:
        return None
    kind, fix = found
    if is_stream(path):  # a pipe has no name to say its format
        fix = "a pipe takes CSV text (zcat FILE | ... for gzip); give any other format as a file, named by its format"
    name = "stdin" if str(path) == STDIN else path
    return DataError(f"{name}: not CSV text: it is {kind}; {fix or 'give the data as CSV, Parquet, Arrow or .npz'}")


BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 LE's mark begins with UTF-16 LE's: it is tried first


def marked_encoding(path: Path, encoding: str) -> str:
    """UTF-16 or UTF-32 where the text (inflated) starts with their byte-order mark and the
    encoding is UTF-8, the default: the mark says how the file is written. Else `encoding`."""
    try:
        if codecs.lookup(encoding).name != "utf-8":
            return encoding
        if is_stream(path):
            start = stream_opened(path).read(4)
        else:
            with OPENERS.get(path.suffix.lower(), open)(path, "rb") as f:
                start = f.read(4)
    except (LookupError, *READ_ERRORS):
        return encoding  # what is wrong is reported where the text is read
    return next((name for mark, name in BOMS if start.startswith(mark)), encoding)
