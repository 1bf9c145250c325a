"""A request body as a table: CSV for text/csv, image files for multipart/form-data, else JSON
(records, dataframe_split, dataframe_records, or {"images": [base64, ...]}); and the HTTP status of
each error it (or the model) raises."""

from __future__ import annotations

import codecs
import json
from email.parser import BytesParser
from email.policy import HTTP
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic_core import from_json

from ...data.records import csv_table, image_table, json_table
from ...data.readers import Table
from ...errors import MagmaError
from .images import not_a_file, rows_refused, settings

if TYPE_CHECKING:
    from .batching import Job
    from .compiled import Compiled

SOURCE = "request"


class BadRequest(MagmaError):
    """A body that is not what the endpoint takes (not JSON, not UTF-8, another content type): 400."""


def parse(job: Job, spec: Any, compiled: Compiled | None = None) -> tuple[Table, np.ndarray | None]:
    """A request body as a table: CSV for text/csv, image files for multipart/form-data, else JSON
    (records, dataframe_split, ..., or {"images": [base64, ...]}); and its rows encoded where the
    model's compiled encoding (`compiled`) takes them (else None: encoded later, by `encode`)."""
    kind = job.content_type.split(";")[0].strip().lower()
    images = settings(spec.data) is not None
    if kind == "multipart/form-data":
        return image_table(_files(job, images), spec, SOURCE), None
    try:
        text = job.body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"{SOURCE}: the body is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if kind in ("text/csv", "application/csv", "text/plain"):
        if images:
            raise rows_refused(spec.data, SOURCE, "CSV text")
        fast = compiled.from_csv(text, spec) if compiled is not None else None
        return fast if fast is not None else (csv_table(text, spec, SOURCE), None)
    if kind not in ("", "application/json"):
        raise BadRequest(f"{SOURCE}: content type {kind!r}; expected application/json, text/csv or (image files) "
                         "multipart/form-data")
    fast = compiled.from_bytes(job.body) if compiled is not None and not images else None
    if fast is not None:  # a body of plain numbers, read from its bytes
        return fast
    payload = _json(text if job.body.startswith(codecs.BOM_UTF8) else job.body)
    if images:
        return _images(payload, spec), None
    fast = compiled.from_json(payload) if compiled is not None else None
    return fast if fast is not None else (json_table(payload, spec, SOURCE), None)


def _json(body: bytes | str) -> Any:
    """A JSON body's value: read by pydantic-core's parser (twice as fast as Python's json, the same
    values: floats correctly rounded, big integers, NaN and Infinity, the last of a repeated key;
    tests/test_serve_fastpath.py), or where it refuses the body, by Python's json, whose message names
    the line and column of the fault (or which takes what it does not: a lone surrogate's escape)."""
    try:
        return from_json(body, allow_inf_nan=True, cache_strings="keys")
    except ValueError:
        pass
    try:
        return json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"{SOURCE}: not JSON ({exc}); expected a JSON list of records or MLflow's dataframe_split "
                         "/ dataframe_records, or a CSV body with Content-Type: text/csv") from None


def _images(payload: Any, spec: Any) -> Table:
    """An image model's JSON body, {"images": [base64, ...]}; table rows are refused, saying how to
    send images."""
    if isinstance(payload, dict) and set(payload) == {"images"}:
        return json_table(payload, spec, SOURCE)
    received = (f"a JSON object with keys {', '.join(map(repr, list(payload)[:4]))}" if isinstance(payload, dict)
                else "a JSON list of records" if isinstance(payload, list) else f"a JSON {type(payload).__name__}")
    raise rows_refused(spec.data, SOURCE, received)


def _files(job: Job, images: bool) -> list[tuple[str, bytes]]:
    """A multipart/form-data body's files (name, bytes), in order; for an image model (`images`), a
    part that is not a file upload (no filename: a text field) is refused, named."""
    if "boundary=" not in job.content_type:
        raise BadRequest(f"{SOURCE}: multipart/form-data without a boundary; send the files as a form (curl -F "
                         "file=@image.png)")
    head = f"Content-Type: {job.content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + job.body)
    parts = list(message.iter_parts()) if message.is_multipart() else []
    if not parts:
        raise BadRequest(f"{SOURCE}: a multipart/form-data body holding no parts; send the image files as a form "
                         "(curl -F file=@image.png)")
    field = next((i for i, part in enumerate(parts) if part.get_filename() is None), None) if images else None
    if field is not None:
        raise not_a_file(SOURCE, field + 1, parts[field].get_param("name", header="content-disposition"))
    return [(part.get_filename() or f"part {i + 1}", part.get_payload(decode=True) or b"")
            for i, part in enumerate(parts)]


def status_of(exc: BaseException) -> int:
    """The HTTP status of an error: 400 for a body the endpoint does not take, 422 for rows that do
    not fit the model (the message `predict` gives), 500 for anything else (a bug)."""
    if isinstance(exc, BadRequest):
        return 400
    if isinstance(exc, MagmaError):
        return 422
    return 500
