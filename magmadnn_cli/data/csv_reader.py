"""CSV text: the dialect (delimiter sniffed among , ; tab | or set; RFC 4180 quotes; any encoding
Python knows; the bytes from `text_source`), the header or data.names, and rows in bounded chunks
parsed by numpy's C reader into the chosen columns."""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, TextIO

import numpy as np

from .. import signals
from ..config.names import FORMATS
from ..core import backend as B
from ..errors import DataError
from .cells import is_missing, is_number, refuse_duplicate_names
from .numbers import OffStyle, detect_style, is_plain, two_way_cells, typed_cells
from .text_source import READ_ERRORS, ReadBound, binary_error, check_file, is_stream, marked_encoding, open_text

MAX_LINE = 1 << 26  # characters in one CSV line (64 Mi: 8 M six-digit values)
DELIMITERS = (",", ";", "\t", "|")
csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE))  # a field may be as long as a line (csv's default: 131,072)


@dataclass(frozen=True)
class CsvFormat:
    delimiter: str = ","
    encoding: str = "utf-8"
    names: tuple[str, ...] | None = None  # the columns' names, when not the header row's (data.names)
    header: bool = True                   # the first line is a header row, not data
    decimal: str = "."                    # how number cells are written (data.decimal, data.thousands)
    thousands: str = ""
    style_detected: bool = False          # decimal and thousands were read off the file, not declared
    style_seen: tuple[str, str] | None = None  # declared: how the file's own lines write numbers, if they show it
    two_way: tuple[str, ...] = ()          # undeclared: cells such as '1.200' that read two ways (numbers.two_way_cells)

    @property
    def plain_numbers(self) -> bool:
        return is_plain(self.decimal, self.thousands)


class CellError(DataError):
    """A cell that is not a number where numbers were parsed (the caller may read it as text)."""


def _first_lines(path: Path, encoding: str, count: int = 20) -> list[str]:
    check_file(path)
    try:
        with open_text(path, encoding) as f:
            lines = [f.readline(MAX_LINE) for _ in range(count)]
    except UnicodeDecodeError as exc:
        raise (binary_error(path) or _decode_error(path, exc, encoding, 1)) from exc
    except READ_ERRORS as exc:
        raise DataError(f"{path}: cannot read a CSV header: {exc}") from exc
    if "\x00" in lines[0] and (binary := binary_error(path)):
        raise binary
    if len(lines[0]) >= MAX_LINE and not lines[0].endswith("\n"):
        raise DataError(f"{path}:1: a header line longer than {MAX_LINE:,} characters; not a CSV (a binary "
                        "or corrupt file?)")
    if "\x00" in lines[0]:
        raise _nul_error(path, lines[0].rstrip("\r\n"), encoding)
    if _is_json_object(lines[0]):
        name = "stdin" if is_stream(path) else str(path)
        raise DataError(f"{name}: JSON Lines (one object a line), read as CSV text: give it as a file named " +
                        FORMATS["jsonl"].hint() + ("; a pipe takes CSV text" if is_stream(path) else ""))
    return [line for line in lines if line.strip()]


def _is_json_object(line: str) -> bool:
    """Whether a first line is a JSON object ({"a": 1}): JSON Lines, not a CSV header."""
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _nul_error(path: Path, line: str, encoding: str) -> DataError:
    """The first line holds NUL characters: UTF-16 text without a byte-order mark read as UTF-8
    (every other character NUL), or not text at all."""
    for order, nuls, text in (("le", line[1::2], line[0::2]), ("be", line[0::2], line[1::2])):
        if nuls and set(nuls) == {"\x00"} and "\x00" not in text:
            return DataError(f"{path}: the text looks like UTF-16 ({'little' if order == 'le' else 'big'}-endian) "
                             f"without a byte-order mark, read as {encoding}; set data.encoding: utf-16-{order}")
    return DataError(f"{path}:1: the first (header) line holds NUL characters; not {encoding} CSV text (a binary "
                     "file? UTF-16 or UTF-32 text without a byte-order mark? set data.encoding)")


def _decode_error(path: Path, exc: UnicodeDecodeError, encoding: str, near_line: int) -> DataError:
    return DataError(f"{path}: not {encoding} text at or after line {near_line} (byte {exc.object[exc.start:exc.start + 1]!r}: "
                     f"{exc.reason}); set data.encoding to the file's encoding, e.g. latin-1 or cp1252")


def detect(path: Path, delimiter: str | None = None, encoding: str = "utf-8",
           names: list[str] | tuple[str, ...] | None = None, optional: tuple[str, ...] = ()) -> CsvFormat:
    """The delimiter: given, tab for .tsv, else the one of , ; tab | that splits the header into
    the most fields and every sampled row into as many (quotes respected). `names`: see `_named`;
    `optional`: the ones a file may lack together (the target's columns, for predict).
    A UTF-16 or UTF-32 byte-order mark sets the encoding (`marked_encoding`)."""
    encoding = marked_encoding(path, encoding)
    if delimiter is not None:
        return _named(path, CsvFormat(delimiter, encoding), names, optional)
    if ".tsv" in path.name.lower():
        return _named(path, CsvFormat("\t", encoding), names, optional)
    return _named(path, CsvFormat(sniff_delimiter(_first_lines(path, encoding)), encoding), names, optional)


def sniff_delimiter(lines: list[str]) -> str:
    """The one of , ; tab | that splits the first lines alike into the most fields (, when none does)."""
    best, fields = ",", 1
    for candidate in DELIMITERS:
        try:
            counts = [len(row) for row in csv.reader(lines, delimiter=candidate)]
        except csv.Error:
            continue
        if counts and counts[0] > fields and all(c == counts[0] for c in counts):
            best, fields = candidate, counts[0]
    return best


def declared_style(decimal: str | None, thousands: str | None) -> tuple[str, str]:
    """data.decimal and data.thousands as set (either may be): thousands '.' alone implies the decimal
    comma that goes with it."""
    return decimal or ("," if thousands == "." else "."), thousands or ""


def with_number_style(path: Path, fmt: CsvFormat, decimal: str | None, thousands: str | None) -> CsvFormat:
    """`fmt` with how its numbers are written: as declared (data.decimal, data.thousands), else
    detected from the file's first lines (a decimal comma in a file not separated by commas)."""
    lines = None if is_stream(path) and (decimal or thousands) else _first_lines(path, fmt.encoding, count=STYLE_LINES)
    detected = detect_style(lines, fmt.delimiter) if lines is not None else None
    if decimal is not None or thousands is not None:
        decimal, thousands = declared_style(decimal, thousands)
        return replace(fmt, decimal=decimal, thousands=thousands, style_seen=detected)
    if detected:
        return replace(fmt, decimal=detected[0], thousands=detected[1], style_detected=True)
    return replace(fmt, two_way=tuple(two_way_cells(lines, fmt.delimiter)))


STYLE_LINES = 200  # lines sampled to detect how numbers are written


def _named(path: Path, fmt: CsvFormat, names: list[str] | tuple[str, ...] | None,
           optional: tuple[str, ...] = ()) -> CsvFormat:
    """The columns' names (data.names) against the file's first row: the same names in any order are
    the file's header, read as it is; a header (`_is_header`) with a name in its place renames the
    columns by position (a duplicate column, say), and one with a name in another place is refused
    (read by position it would mix columns); any other first row is data. A first row one field
    short of the names by the `optional` columns (the target's), where they may be left out, names the others."""
    if not names:
        return fmt
    first, second = _first_rows(path, fmt)
    if optional and set(optional) <= set(names) and len(first) == len(names) - len(optional):
        names = tuple(name for name in names if name not in optional)
    if sorted(first) == sorted(names):
        return fmt
    position = {name: i for i, name in enumerate(names)}
    header = _is_header(first, second, position)
    if header:
        _refuse_misplaced(path, first, list(names), position)
    return replace(fmt, names=tuple(names), header=header)


def _is_header(first: list[str], second: list[str], position: dict[str, int]) -> bool:
    """Whether a first row is a header: half its fields (two or more) are words among the names (a
    data row holds a name as a value rarely; names that are numbers say nothing), or a word stands
    above a number in some column, as csv.Sniffer.has_header judges."""
    named = sum(1 for field in first if field in position and not is_number(field))
    if named >= 2 and 2 * named >= len(first):
        return True
    return any(a and not is_number(a) and not is_missing(np.array([a]))[0] and is_number(b)
               for a, b in zip(first, second))


def _refuse_misplaced(path: Path, first: list[str], names: list[str], position: dict[str, int]) -> None:
    """A header field that is one of `names`, once in the row, in another column than `names` gives it."""
    once = {f for f, count in Counter(first).items() if count == 1}
    for i, field in enumerate(first):
        if field in once and field in position and position[field] != i:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            there = repr(names[i]) if i < len(names) else "no column"
            raise DataError(f"{path}:1: the header has {field!r} in column {i + 1}, where data.names puts {there} "
                            f"({field!r} is column {position[field] + 1} there): read by position it would mix "
                            f"columns. Give the file a header of data.names' names, in any order ({shown}), or "
                            "its columns in that order")


def _header_lines(path: Path, encoding: str) -> list[str]:
    """The first record's physical lines: one, or more where a quoted name holds a line break."""
    _first_lines(path, encoding, count=1)  # the file's kind and encoding checked, with their messages
    try:
        with open_text(path, encoding) as f:
            return _read_lines(f, 1, MAX_LINE)
    except READ_ERRORS as exc:
        raise DataError(f"{path}: cannot read a CSV header: {exc}") from exc


def csv_header(path: Path, fmt: CsvFormat | None = None) -> list[str]:
    """The column names (quotes removed by the parser, spaces stripped; a quoted name may hold a line
    break); duplicates refused, in time linear in the column count."""
    fmt = fmt or detect(path)
    lines = _header_lines(path, fmt.encoding)
    try:
        header = next(csv.reader(lines[:1], delimiter=fmt.delimiter), None)
    except csv.Error as exc:
        raise DataError(f"{path}: cannot read a CSV header: {exc}") from exc
    if not header or not any(h.strip() for h in header):
        raise DataError(f"{path}: empty file; expected a CSV with a header row")
    if fmt.names is not None:
        if len(header) != len(fmt.names):
            shown = ", ".join(fmt.names[:8]) + (", ..." if len(fmt.names) > 8 else "")
            raise DataError(f"{path}:1: the row has {len(header)} fields; data.names lists {len(fmt.names)} columns "
                            f"({shown}): give rows of those columns, with or without a header row")
        return list(fmt.names)
    names = [h.strip() for h in header]
    refuse_duplicate_names(path, names, "the header", "rename them in the file (or, to train on it, give "
                           "data.names: every column's name, in order; they replace the header's)")
    return names


def _first_rows(path: Path, fmt: CsvFormat) -> tuple[list[str], list[str]]:
    """The first two lines' fields, stripped (a header and a row, or a headerless file's first rows)."""
    lines = _first_lines(path, fmt.encoding, count=2)
    try:
        rows = [[h.strip() for h in row] for row in csv.reader(lines[:2], delimiter=fmt.delimiter)]
    except csv.Error as exc:
        raise DataError(f"{path}: cannot read the first CSV lines: {exc}") from exc
    return (rows + [[], []])[0], (rows + [[], []])[1]


def _column_error(path: Path, exc: ValueError, names: list[str], first_line: int) -> DataError:
    """numpy's loadtxt message (0-based row, 1-based column of the file), restated with file:line
    and the column's name."""
    text = str(exc)
    m = re.search(r"could not convert string '(.*)' to \w+ at row (\d+), column (\d+)", text)
    if m:
        value, row, col = m.group(1), int(m.group(2)), int(m.group(3))
        name = names[col - 1] if 0 < col <= len(names) else f"#{col}"
        what = "an empty cell (missing value)" if value.strip() == "" else f"a non-numeric value {value!r}"
        return CellError(f"{path}:{first_line + row}: column {name!r} holds {what}; expected a number")
    return DataError(f"{path}: cannot parse the CSV: {text}")


def parse_rows(lines: list[str], path: Path, names: list[str], columns: list[int], first_line: int,
               fmt: CsvFormat | None = None, dtype: Any = np.float32) -> np.ndarray:
    """Parse CSV lines (no header; lines[0] is file line `first_line`) into the chosen columns;
    quoted fields may hold the delimiter."""
    fmt = fmt or CsvFormat()
    quoted = any('"' in line for line in lines)
    if quoted:
        fields = np.fromiter((len(row) for row in csv.reader(lines, delimiter=fmt.delimiter)), dtype=np.int64,
                             count=len(lines))
    else:  # no quotes in this chunk: counting delimiters is exact (and faster: docs/performance.md)
        fields = np.fromiter((line.count(fmt.delimiter) + 1 for line in lines), dtype=np.int64, count=len(lines))
    ragged = np.flatnonzero(fields != len(names))
    if ragged.size:
        i = int(ragged[0])
        cut = (" (the file's last line, with no line break after it: cut short?)"
               if i == len(lines) - 1 and fields[i] < len(names) and not lines[i].endswith("\n") else "")
        raise DataError(f"{path}:{first_line + i}: the row has {fields[i]} fields; the header has {len(names)}{cut}")
    if dtype is str:
        _check_text_width(lines, path, names, columns, first_line, fmt)
    text = dtype is str  # read as Python strings, then made one array: loadtxt's own str dtype costs ~1.5 ms a
    try:                 # call whatever the rows (a served request's), and 2.4x as long per row on a whole chunk
        cells = np.loadtxt(lines, delimiter=fmt.delimiter, dtype=object if text else dtype, usecols=columns, ndmin=2,
                           comments=None, quotechar='"' if quoted else None)
        return cells.astype(str) if text else cells
    except ValueError as exc:
        raise _column_error(path, exc, names, first_line) from exc


TEXT_SHARE = 8  # text held as wide as its long cells may take this share of the memory budget
LONG = 1024  # characters: longer than any number, date or category name; such cells make all text this wide


def text_too_large(need: int, longest: int, name: str) -> str | None:
    """Why text cells held as wide as the longest (`need` bytes) are refused, and the fix; None where
    they are not. Long cells (free text: over LONG characters) may make the text of every row take
    1/TEXT_SHARE of the memory budget; short ones (the text as large as the data) the whole budget."""
    budget = B.host_memory_available() or 2**40
    limit = budget // TEXT_SHARE if longest > LONG else budget
    if need <= limit:
        return None
    return (f"more than {f'1/{TEXT_SHARE} of ' if limit < budget else ''}the {B.budget_text(budget)}. magmadnn "
            f"reads numbers, categories, booleans and dates: leave the column out (data.columns.{name}: ignore), "
            f"or {'shorten its cells' if longest > LONG else 'read fewer rows'}")


def _check_text_width(lines: list[str], path: Path, names: list[str], columns: list[int], first_line: int,
                      fmt: CsvFormat) -> None:
    """Text cells are held as wide as the chunk's longest (4 bytes a character): where its lines are
    long enough that the chosen columns could take more than 1/TEXT_SHARE of the memory budget so, the
    longest cell is found, and a column it makes too large (`text_too_large`) refused by name and line."""
    if 4 * max(map(len, lines)) * len(lines) * len(columns) <= (B.host_memory_available() or 2**40) // TEXT_SHARE:
        return
    chosen = set(columns)
    longest, where = 0, (0, 0)
    for i, row in enumerate(csv.reader(lines, delimiter=fmt.delimiter)):
        for j, field in enumerate(row):
            if j in chosen and len(field) > longest:
                longest, where = len(field), (i, j)
    need = 4 * longest * len(lines) * len(columns)
    if (why := text_too_large(need, longest, names[where[1]])) is not None:
        i, j = where
        line = first_line + sum(line.count("\n") for line in lines[:i])
        raise DataError(f"{path}:{line}: column {names[j]!r} holds a cell of {longest:,} characters; held as text, "
                        f"{len(lines):,} rows of {len(columns)} column(s) that wide would take {B.gib(need)}, {why}")


def parse_cells(lines: list[str], path: Path, names: list[str], columns: list[int], first_line: int,
                fmt: CsvFormat, dtype: Any, text: set[int]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The chosen columns of CSV lines as numbers (NaN where a cell is missing: blank, NA, ?, ...)
    and, for the positions in `text` and any column holding a non-number, as text (missing: '')."""
    if not text and fmt.plain_numbers:
        try:
            return parse_rows(lines, path, names, columns, first_line, fmt, dtype), {}
        except CellError:  # missing or text cells in this chunk: read them as text, column by column
            signals.check()  # unless the "cell" was a stop signal numpy turned into a parse error
    try:
        return typed_cells(parse_rows(lines, path, names, columns, first_line, fmt, str), dtype, text, fmt.decimal,
                           fmt.thousands)
    except OffStyle as exc:
        raise DataError(f"{path}:{first_line + exc.row}: column {names[columns[exc.column]]!r}: {exc.cell!r} is not a "
                        f"number as this file writes them (decimal mark {fmt.decimal!r}, thousands "
                        f"{fmt.thousands or 'none'!r}{', detected' if fmt.style_detected else ''}); write it so, or "
                        "set data.decimal and data.thousands") from None


CHUNK_CHARS = 1 << 23  # characters of CSV text per chunk (8 Mi: bounded memory whatever the row width)


def _read_lines(f: TextIO, chunk_rows: int, chunk_chars: int) -> list[str]:
    """Up to `chunk_rows` records, stopping once they hold `chunk_chars` characters. A record whose
    quotes are open at the line's end (RFC 4180: a quoted field may hold line breaks) takes the
    next lines until they close (bounded by MAX_LINE characters in all)."""
    lines, size = [], 0
    while len(lines) < chunk_rows and size < chunk_chars:
        line = f.readline(MAX_LINE)
        if not line:
            break
        while line.count('"') % 2 and len(line) < MAX_LINE and line.endswith("\n"):
            more = f.readline(MAX_LINE)
            if not more:
                break
            line += more
        lines.append(line)
        size += len(line)
    return lines


def iter_csv_chunks(path: Path, chunk_rows: int = 65536, fmt: CsvFormat | None = None,
                    chunk_chars: int = CHUNK_CHARS, bound: ReadBound | None = None) -> Iterator[tuple[int, list[str]]]:
    """(line number of the first row, raw lines) for consecutive chunks after the header, each of at
    most `chunk_rows` lines and about `chunk_chars` characters. Lines are bounded, and so is what the
    chunks add up to (`bound`: the text, or the rows of a table read whole): a gzip bomb, or a stream
    without line breaks, is refused while it is read."""
    fmt = fmt or CsvFormat()
    bound = bound or ReadBound(path)
    line_no = 1
    try:
        with open_text(path, fmt.encoding) as f:
            if fmt.header:  # the header record: one line, or more where a quoted name holds a line break
                line_no += sum(line.count("\n") for line in _read_lines(f, 1, MAX_LINE))
            while True:
                lines = _read_lines(f, chunk_rows, chunk_chars)
                long = next((i for i, line in enumerate(lines) if len(line) >= MAX_LINE and not line.endswith("\n")), None)
                if long is not None:
                    raise DataError(f"{path}:{line_no + long}: a line longer than {MAX_LINE:,} characters; not a CSV "
                                    "of rows (a binary or corrupt file?)")
                physical = sum(line.count("\n") for line in lines)
                bound.add(sum(map(len, lines)), len(lines))
                lines = [line for line in lines if line.strip()]
                if not lines:
                    return
                signals.check()  # a stop signal whose exception a caller's fallback took for bad data
                yield line_no, lines
                line_no += physical
    except UnicodeDecodeError as exc:
        raise _decode_error(path, exc, fmt.encoding, line_no) from exc
    except READ_ERRORS as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
