"""Tables from rows held in memory (a server's request body): JSON records (`[{"age": 41, ...}]`),
MLflow's `dataframe_split` (`{"columns": [...], "data": [[...]]}`) and `dataframe_records`, and CSV
text. Each becomes the Table a file reader gives for the same rows: the same columns checked against
the model's, the same cell parsing (numbers, text, missing cells, data.missing_tokens), so a model
answers them as `predict` answers a file of those rows."""

from __future__ import annotations

import base64
import binascii
import csv
import io
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from ..core import backend as B
from ..errors import DataError
from . import image_decode
from .columns import RawColumns, refuse_duplicate_names
from .csv_reader import STYLE_LINES, CsvFormat, declared_style, parse_cells, sniff_delimiter
from .numbers import detect_style, typed_cells
from .table import ReadSpec, Table, _closest, checked_columns

NUMBER = (int, float)
NUMERIC = {int, float, type(None)}  # the types of a column read as numbers (null: a missing cell)


def json_table(payload: Any, spec: ReadSpec, source: str) -> Table:
    """A JSON body as a table: a list of records, {"dataframe_split": {...}}, {"dataframe_records":
    [...]}, {"columns": [...], "data": [...]} or MLflow's {"instances" | "inputs": [records]}."""
    if isinstance(payload, list):
        return records_table(payload, spec, source)
    if isinstance(payload, dict):
        if set(payload) == {"columns", "data"} or set(payload) == {"columns", "data", "index"}:
            return split_table(payload, spec, source)
        if set(payload) == {"images"}:
            return image_table(_base64_images(payload["images"], source), spec, source)
        keys = [k for k in ("dataframe_split", "dataframe_records", "instances", "inputs") if k in payload]
        if len(keys) == 1 and len(payload) <= 2:  # MLflow sends "params" beside the data
            body = payload[keys[0]]
            return split_table(body, spec, f"{source} ({keys[0]})") if keys[0] == "dataframe_split" else \
                records_table(body, spec, f"{source} ({keys[0]})")
    raise DataError(f"{source}: expected a JSON list of records ([{{\"column\": value, ...}}, ...]), "
                    "{\"dataframe_split\": {\"columns\": [...], \"data\": [[...], ...]}}, {\"dataframe_records\": "
                    f"[...]}} or (an image model) {{\"images\": [base64, ...]}}; received {_kind(payload)}" + (f" with keys {', '.join(map(repr, list(payload)[:6]))}"
                                                           if isinstance(payload, dict) else ""))


def image_table(images: list[tuple[str, bytes]], spec: ReadSpec, source: str) -> Table:
    """Image files held in memory (an upload's files, named) as a table of (N, C, H, W) samples,
    decoded with the model's saved data.image settings as `predict` decodes files."""
    settings = spec.data.image if spec.data is not None else None
    if settings is None or not settings.size or settings.color == "auto":
        raise DataError(f"{source}: image files, but this model was not trained on image files (it has no data.image "
                        "settings); send its rows as JSON records or CSV")
    if image_decode.Image is None:
        raise DataError(f"{source}: decoding image files needs Pillow: pip install 'magmadnn-cli[images]'")
    how = image_decode.Decoding((int(settings.size[0]), int(settings.size[1])), settings.color, settings.resize)
    dtype = np.dtype(spec.dtype or np.float32)
    need, available = len(images) * int(np.prod(how.shape)) * dtype.itemsize, B.host_memory_available()
    if available is not None and need > available:  # a few bytes of PNG each may decode to megabytes
        raise DataError(f"{source}: {len(images):,} images decode to {B.gib(need)} (samples of shape {how.shape}); "
                        f"{B.budget_text(available)}: send fewer images a request")
    x = np.zeros((len(images), *how.shape), dtype)
    for i, (name, data) in enumerate(images):  # a file at a time: Pillow decodes one
        try:
            x[i] = image_decode.decode(io.BytesIO(data), how)  # type: ignore[arg-type]  (Pillow opens files)
        except Exception as exc:  # noqa: BLE001  every failure of a file is named
            raise DataError(f"{source}: image {i + 1} ({name}) cannot be decoded: {image_decode.why(exc)}; send "
                            "image files (PNG, JPEG, ...)") from None
    return Table(RawColumns(x), None, [f"pixel{i}" for i in range(int(np.prod(how.shape)))], source)


def _base64_images(images: Any, source: str) -> list[tuple[str, bytes]]:
    """{"images": [base64 text, ...]}'s files, named by position."""
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise DataError(f"{source}: \"images\": expected a list of base64 texts, one image file each; received "
                        f"{_kind(images)}")
    files = []
    for i, text in enumerate(images):
        try:
            files.append((f"images[{i}]", base64.b64decode(text, validate=True)))
        except (binascii.Error, ValueError) as exc:
            raise DataError(f"{source}: image {i + 1}: not base64 ({exc}); send each file's bytes base64-encoded") \
                from None
    return files


def records_table(records: Any, spec: ReadSpec, source: str) -> Table:
    """Records (one JSON object a row) as a table; a key a record lacks is a missing cell, as in a
    JSON Lines file."""
    if not isinstance(records, list):
        raise DataError(f"{source}: expected a list of records ([{{\"column\": value, ...}}, ...]); received "
                        f"{_kind(records)}")
    bad = next((i for i, r in enumerate(records) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataError(f"{source}: data row {bad + 1}: a JSON {_kind(records[bad])}, not an object; expected one "
                        "record ({\"column\": value, ...}) a row")
    keys = records[0].keys() if records else {}.keys()
    if all(r.keys() == keys for r in records):  # every record of the same columns: read by name
        return values_table(list(keys), records, spec, source)
    names = list(dict.fromkeys(key for record in records for key in record))
    return values_table(names, [[r.get(n) for n in names] for r in records], spec, source)


def split_table(body: Any, spec: ReadSpec, source: str) -> Table:
    """pandas' `to_dict(orient="split")` (MLflow's dataframe_split): column names and rows of values."""
    if not isinstance(body, dict) or not isinstance(body.get("columns"), list) or not isinstance(body.get("data"), list):
        raise DataError(f"{source}: expected {{\"columns\": [names], \"data\": [[values], ...]}}; received "
                        f"{_kind(body)}" + (f" with keys {', '.join(map(repr, list(body)[:6]))}"
                                            if isinstance(body, dict) else ""))
    names, rows = [str(n) for n in body["columns"]], body["data"]
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(names):
            got = f"{len(row)} values" if isinstance(row, list) else f"a JSON {_kind(row)}"
            raise DataError(f"{source}: data row {i + 1} has {got}; \"columns\" names {len(names)}: give each row "
                            "one value per column, in that order")
    return values_table(names, rows, spec, source)


def values_table(names: list[str], rows: list[list[Any]] | list[dict[str, Any]], spec: ReadSpec,
                 source: str) -> Table:
    """Rows of JSON values under `names` (lists in that order, or records holding each name) as a
    table: numbers as numbers, null as a missing cell, strings and booleans as a CSV cell holding them
    would be read. Columns are typed a kind at a time (numbers, declared text, the rest), not one by
    one: a request of one row costs little."""
    wanted = _wanted(names, spec, source)
    position = {n: i for i, n in enumerate(names)}
    get = itemgetter(*(wanted if rows and isinstance(rows[0], dict) else [position[n] for n in wanted]))
    cells = [get(row) for row in rows] if len(wanted) > 1 else [(get(row),) for row in rows]
    text, dtype = spec.text_columns(wanted), spec.dtype or np.float32
    if not text and set(map(type, chain.from_iterable(cells))) <= {int, float}:  # numbers only: the common case
        x = _numbers(cells, (len(rows), len(wanted)), dtype)
        if x is not None:
            return spec.blanked(Table(RawColumns(x), None, wanted, source))
    columns = list(zip(*cells)) if cells else [() for _ in wanted]
    x = np.full((len(rows), len(wanted)), np.nan, dtype)
    numeric = [j for j, column in enumerate(columns) if j not in text and set(map(type, column)) <= NUMERIC]
    numbers = _numbers([columns[j] for j in numeric], (len(numeric), len(rows)), dtype)
    if numbers is not None:
        x[:, numeric] = numbers.T
    texts = {j: _texts(column, wanted[j], source)  # in column order: the first bad cell named
             for j, column in enumerate(columns) if j not in numeric or numbers is None}
    return spec.blanked(Table(RawColumns(x, _typed_cells(texts, len(rows), x, text)), None, wanted, source))


def _typed_cells(texts: dict[int, list[str]], rows: int, x: np.ndarray, text: set[int]) -> dict[int, np.ndarray]:
    """Columns of cells as text (declared text, or holding strings or booleans): the declared ones
    as text, the others numbers where every present cell is one, as a CSV file's cells are typed
    (numbers into x; the text columns returned)."""
    if not texts:
        return {}
    positions = list(texts)
    typed, found = typed_cells(np.array(list(texts.values()), dtype=str).reshape(len(texts), rows).T, x.dtype,
                               {k for k, j in enumerate(positions) if j in text})
    x[:, positions] = typed
    return {positions[k]: column for k, column in found.items()}


@dataclass(frozen=True)
class CsvBody:
    """A CSV body as the line reader takes it: its data lines (the first is line `first_line`), their
    format, the columns they hold and the model's among them (checked)."""
    rows: list[str]
    fmt: CsvFormat
    names: list[str]
    wanted: list[str]
    first_line: int


def csv_body(text: str, spec: ReadSpec, source: str) -> CsvBody:
    """CSV text (a header row, or rows of data.names' columns without one): its lines and columns,
    dialect and number style as for a file."""
    lines = [line for line in io.StringIO(text).readlines() if line.strip()]
    if not lines:
        raise DataError(f"{source}: empty CSV body; expected a header row and data rows")
    fmt = _csv_format(lines, spec)
    first = next(csv.reader(lines[:1], delimiter=fmt.delimiter))
    names = [f.strip() for f in first]
    header = True
    if spec.header and not (set(names) & set(spec.header)):  # data.names: rows of those columns, no header row
        header = False
        targets = _targets(spec)
        names = [n for n in spec.header if len(first) == len(spec.header) or n not in targets]
    return CsvBody(lines[1:] if header else lines, fmt, names, _wanted(names, spec, source), 1 + header)


def csv_table(text: str, spec: ReadSpec, source: str) -> Table:
    """CSV text as a table, its cells parsed by the CSV line reader (`csv_body`)."""
    body = csv_body(text, spec, source)
    wanted = body.wanted
    if not body.rows:
        return Table(RawColumns(np.zeros((0, len(wanted)), spec.dtype or np.float32)), None, wanted, source)
    position = {n: i for i, n in enumerate(body.names)}
    x, strings = parse_cells(body.rows, source, body.names, [position[n] for n in wanted], body.first_line, body.fmt,
                             spec.dtype or np.float32, spec.text_columns(wanted))
    return spec.blanked(Table(RawColumns(x, strings), None, wanted, source))


def _csv_format(lines: list[str], spec: ReadSpec) -> CsvFormat:
    """The body's delimiter (data.delimiter, else sniffed as a file's) and number style (data.decimal /
    data.thousands, else detected from its first lines as a file's: comma-separated lines without a
    quote hold no cell with a comma, so their style is plain, as `detect_style` finds)."""
    data = spec.data
    delimiter = (data.delimiter if data is not None else None) or sniff_delimiter(lines[:20])
    decimal, thousands = (data.decimal, data.thousands) if data is not None else (None, None)
    if decimal is None and thousands is None:
        sample = lines[:STYLE_LINES]
        plain = delimiter == "," and not any('"' in line for line in sample)
        decimal, thousands = (None if plain else detect_style(sample, delimiter)) or (".", "")
    decimal, thousands = declared_style(decimal, thousands)
    return CsvFormat(delimiter, decimal=decimal, thousands=thousands)


def _wanted(names: list[str], spec: ReadSpec, source: str) -> list[str]:
    """The model's feature columns, checked against the body's as against a file's; a column the
    model does not know is refused (a misspelt name would otherwise be a missing cell, filled)."""
    refuse_duplicate_names(source, names, "the request", "give each column once")
    wanted = checked_columns(source, names, spec)  # type: ignore[arg-type]  (a name, not a path)
    known = set(wanted) | set(_targets(spec))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DataError(f"{source}: unknown column(s) {', '.join(map(repr, unknown[:10]))}"
                        + (f" (+{len(unknown) - 10} more)" if len(unknown) > 10 else "")
                        + f"{_closest(unknown[0], [w for w in wanted if w not in names])}; the model reads "
                        f"{', '.join(wanted[:20])}{', ...' if len(wanted) > 20 else ''}: leave the others out")
    return wanted


def _targets(spec: ReadSpec) -> list[str]:
    """The training data's target columns (a body may hold them; they are not read)."""
    return spec.data.target_columns if spec.data is not None else [spec.target] if spec.target else []


def _numbers(values: list[Any], shape: tuple[int, int], dtype: Any) -> np.ndarray | None:
    """JSON numbers (null: NaN), rows of them, as the float type (through float64, as a CSV cell is
    read); None where one is beyond float64 (a huge integer: read as text, then as infinity)."""
    try:
        wide = np.array(values, dtype=np.float64).reshape(shape)
    except OverflowError:
        return None
    with np.errstate(over="ignore"):  # beyond the float type: inf, refused by cell later
        return wide.astype(dtype)


def _texts(column: tuple[Any, ...], name: str, source: str) -> list[str]:
    """A column of JSON values as CSV cells would hold them (`json_cell`'s), a column at a time where it
    holds strings or numbers only (and nulls), else a cell at a time."""
    kinds = set(map(type, column))
    if kinds <= {str}:
        return list(column)
    if kinds <= {int, float}:
        return list(map(repr, column))
    if kinds <= {str, type(None)} or kinds <= NUMERIC:
        return ["" if v is None else v if type(v) is str else repr(v) for v in column]
    return [json_cell(v, name, source, i) for i, v in enumerate(column)]


def json_cell(value: Any, column: str, source: str, row: int) -> str:
    """A JSON value as a CSV cell would hold it (null: a missing cell)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, NUMBER):
        return repr(value)
    raise DataError(f"{source}: column {column!r}, data row {row + 1}: a JSON {_kind(value)}; expected a number, "
                    "a string, true/false or null (a flat table: one value a cell)")


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, NUMBER) else type(value).__name__)
