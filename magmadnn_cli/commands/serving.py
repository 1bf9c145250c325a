"""What `magmadnn serve` runs behind its HTTP layer: the model's own thread, which takes requests in
batches (up to --max-batch-rows rows, waiting at most --max-wait-ms for more) and answers each exactly
as it would alone; the counters /metrics shows; what /metadata says. No web framework here."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import __version__
from ..data.columns import RawColumns
from ..data.fitting import column_strategy
from ..data.records import csv_table, image_table, json_table
from ..data.readers import Table
from ..errors import MagmaError
from ..files import file_sha256, json_object
from ..inference import Predictor, new_tally, read_spec
from ..inference.encoding import fill_of
from ..training.run_folder import RunFolder

SOURCE = "request"


class BadRequest(MagmaError):
    """A body that is not what the endpoint takes (not JSON, not UTF-8, another content type): 400."""


@dataclass
class Job:
    """One request's body and what it asks for; `answer` is called once, from the model's thread,
    with the output rows (text) or the error."""
    body: bytes
    content_type: str
    proba: bool
    answer: Callable[[np.ndarray | None, BaseException | None], None]
    cancelled: bool = False
    table: Table | None = None


def parse(job: Job, spec: Any) -> Table:
    """A request body as a table: CSV for text/csv, image files for multipart/form-data, else JSON
    (records, dataframe_split, ..., or {"images": [base64, ...]})."""
    kind = job.content_type.split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return image_table(_files(job), spec, SOURCE)
    try:
        text = job.body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"{SOURCE}: the body is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if kind in ("text/csv", "application/csv", "text/plain"):
        return csv_table(text, spec, SOURCE)
    if kind not in ("", "application/json"):
        raise BadRequest(f"{SOURCE}: content type {kind!r}; expected application/json, text/csv or (image files) "
                         "multipart/form-data")
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise BadRequest(f"{SOURCE}: not JSON ({exc}); expected a JSON list of records or MLflow's dataframe_split "
                         "/ dataframe_records, or a CSV body with Content-Type: text/csv") from None
    return json_table(payload, spec, SOURCE)


def _files(job: Job) -> list[tuple[str, bytes]]:
    """A multipart/form-data body's files (name, bytes), in order."""
    if "boundary=" not in job.content_type:
        raise BadRequest(f"{SOURCE}: multipart/form-data without a boundary; send the files as a form (curl -F "
                         "file=@image.png)")
    head = f"Content-Type: {job.content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + job.body)
    parts = list(message.iter_parts()) if message.is_multipart() else []
    if not parts:
        raise BadRequest(f"{SOURCE}: a multipart/form-data body holding no parts; send the image files as a form "
                         "(curl -F file=@image.png)")
    return [(part.get_filename() or f"part {i + 1}", part.get_payload(decode=True) or b"")
            for i, part in enumerate(parts)]


class Service:
    """The model and its thread. Requests are queued (`submit`); the thread parses each and gathers
    up to `max_rows` rows (waiting at most `max_wait` seconds for more). A batch's rows are encoded
    together (row by row exact: lookups and elementwise arithmetic) and their answers formatted
    together; the network runs once per request, on that request's rows (in the memory layout their
    own encoding gives), as `predict` runs it on a file of them, so an answer is exactly what the
    request alone gets whatever else is queued (BLAS sums a row differently in a batch of another
    shape or layout: a merged network batch would change answers in their 7th digit). A batch whose
    encoding fails is answered request by request (each its own error or answer)."""

    def __init__(self, model: Predictor, max_rows: int, max_wait: float, metrics: "Metrics") -> None:
        self.model, self.max_rows, self.max_wait, self.metrics = model, max_rows, max_wait, metrics
        self.ready = threading.Event()
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="magmadnn-model", daemon=True)
        with model.using():
            self.spec = read_spec(model.path, model.saved, False)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Ends the thread once the requests queued before are answered."""
        self.jobs.put(None)
        self.thread.join()

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def _run(self) -> None:
        with self.model.using():
            self._warm_up()
            self.ready.set()
            while (batch := self._gather()) is not None:
                jobs = [job for job in batch if job.table is not None and not job.cancelled]
                self.metrics.batch(sum(len(job.table.x) for job in jobs))
                if len(jobs) > 1:
                    self._answer_together(jobs)
                elif jobs:
                    self._answer(jobs[0])

    def _warm_up(self) -> None:
        """One batch through the network (a row of zeros), so the first request is not the slow one."""
        shape = (1,) + tuple(self.model.saved.sample_shape)
        self.model.outputs(np.zeros(shape, self.spec.dtype), "warm-up", lambda rows: [int(r) + 1 for r in rows])

    def _gather(self) -> list[Job] | None:
        """The next batch: the first request queued, then those that arrive within max_wait while
        the rows stay under max_rows (None: stop)."""
        first = self.jobs.get()
        if first is None:
            return None
        batch, rows = [first], self._parsed(first)
        deadline = time.monotonic() + self.max_wait
        while rows < self.max_rows:
            try:
                job = self.jobs.get(timeout=max(0.0, deadline - time.monotonic())) if self.max_wait else \
                    self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self.jobs.put(None)  # stop after this batch
                break
            batch.append(job)
            rows += self._parsed(job)
        return batch

    def _parsed(self, job: Job) -> int:
        """Parses the job's body into its table (rows), or answers it with the error (0 rows)."""
        if job.cancelled:
            return 0
        try:
            job.table = parse(job, self.spec)
        except Exception as exc:  # noqa: BLE001 (answered: a bad request never stops the thread)
            job.answer(None, exc)
            return 0
        return len(job.table.x)

    def _answer_together(self, jobs: list[Job]) -> None:
        """The jobs' rows encoded as one table and their answers formatted at once; the network
        run on each job's rows alone. Where the encoding fails, each job is answered alone."""
        tables: list[Table] = [job.table for job in jobs]  # type: ignore[misc]  (parsed: tables)
        table = merged(tables)
        try:
            x = self.model.encoded(table, False, new_tally()) if table is not None else None
        except Exception:  # noqa: BLE001  (answered below, each request alone: its own message)
            x = None
        if x is None:
            for job in jobs:
                self._answer(job)
            return
        ends = np.cumsum([len(t.x) for t in tables])
        outputs, answered = [], []
        for job, part, end in zip(jobs, tables, ends):
            rows = x[end - len(part.x):end].copy(order="K")  # laid out as encoding it alone lays it out
            try:
                outputs.append(self.model.table_outputs(rows, part))
            except Exception as exc:  # noqa: BLE001  (answered: a bad request never stops the thread)
                job.answer(None, exc)
                continue
            answered.append(job)
        if answered:
            self._send(answered, np.concatenate(outputs))

    def _send(self, jobs: list[Job], outputs: np.ndarray) -> None:
        """Each job's output rows as text, formatted at once per setting of `proba` the jobs ask for
        (a multi-label answer's columns without probabilities are not a prefix of those with them)."""
        texts = {proba: self.model.rows(outputs, proba) for proba in {job.proba for job in jobs}}
        ends = np.cumsum([len(job.table.x) for job in jobs])  # type: ignore[union-attr]
        for job, end in zip(jobs, ends):
            rows = texts[job.proba][end - len(job.table.x):end]  # type: ignore[union-attr]
            self.metrics.rows += len(rows)
            job.answer(rows, None)

    def _answer(self, job: Job) -> None:
        if job.table is None or job.cancelled:
            return
        try:
            rows = self.model.predict_table(job.table, job.proba, (), False, new_tally())
        except Exception as exc:  # noqa: BLE001
            job.answer(None, exc)
            return
        self.metrics.rows += len(rows)
        job.answer(rows, None)


def merged(tables: list[Table]) -> Table | None:
    """The tables' rows as one table (None where their columns differ: the same features, and the
    same of them read as text)."""
    first = tables[0]
    if any(t.features != first.features or t.raw.text.keys() != first.raw.text.keys() or t.raw.x.ndim != 2
           or t.raw.x.dtype != first.raw.x.dtype for t in tables):
        return None
    text = {j: np.concatenate([t.raw.text[j] for t in tables]) for j in first.raw.text}
    return Table(RawColumns(np.concatenate([t.raw.x for t in tables]), text), None, first.features, SOURCE)


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        counts = self.counts or [0] * len(self.bounds)
        sep = "," if labels else ""
        return ([f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.bounds, counts)]
                + [f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}',
                   f"{name}_sum{{{labels}}} {self.total:.6f}" if labels else f"{name}_sum {self.total:.6f}",
                   f"{name}_count{{{labels}}} {self.count}" if labels else f"{name}_count {self.count}"])


class Metrics:
    """Counters for /metrics (Prometheus' text format 0.0.4): requests by endpoint and status,
    latency of the prediction endpoints, rows answered, rows per model batch, requests in flight."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batches = Histogram(BATCH_BUCKETS)
        self.rows = 0
        self.in_flight = 0

    def request(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] += 1
        if path in ("/predict", "/invocations"):
            self.latency.setdefault(path, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, rows: int) -> None:
        self.batches.observe(rows)

    def text(self) -> str:
        lines = ["# HELP magmadnn_requests_total HTTP requests answered, by endpoint and status code.",
                 "# TYPE magmadnn_requests_total counter"]
        lines += [f'magmadnn_requests_total{{endpoint="{p}",status="{s}"}} {n}'
                  for (p, s), n in sorted(self.requests.items())]
        lines += ["# HELP magmadnn_request_seconds Time to answer a prediction request.",
                  "# TYPE magmadnn_request_seconds histogram"]
        for path, histogram in sorted(self.latency.items()):
            lines += histogram.lines("magmadnn_request_seconds", f'endpoint="{path}"')
        lines += ["# HELP magmadnn_rows_total Rows predicted.", "# TYPE magmadnn_rows_total counter",
                  f"magmadnn_rows_total {self.rows}",
                  "# HELP magmadnn_batch_rows Rows in each batch the model's thread took.",
                  "# TYPE magmadnn_batch_rows histogram", *self.batches.lines("magmadnn_batch_rows"),
                  "# HELP magmadnn_requests_in_flight Requests being answered now.",
                  "# TYPE magmadnn_requests_in_flight gauge", f"magmadnn_requests_in_flight {self.in_flight}"]
        return "\n".join(lines) + "\n"


def metadata(model: Predictor) -> dict[str, Any]:
    """What /metadata says: the inputs (type, categories, what a missing cell does), the outputs and
    labels, the training metrics, the tool's version and the model file's sha256."""
    saved = model.saved
    cfg = saved.config.data
    columns = {c.name: c for c in saved.encoder.columns}
    inputs = []
    for name in saved.features:
        column = columns.get(name)
        kind = column.kind if column is not None else "number"
        entry: dict[str, Any] = {"name": name, "type": kind}
        if column is not None and column.kind == "category":
            entry["categories"] = list(column.categories)
        if column is None:  # a model of numbers only, fitted without an encoding: complete rows only
            entry["missing"] = "refused"
        elif column.kind != "constant":
            refused = column_strategy(cfg.column_spec(name).missing, cfg.missing_values, column.kind) == "error"
            entry["missing"] = "refused" if refused else f"filled: {fill_of(saved, name)}"
        inputs.append(entry)
    return {"model": str(model.path), "sha256": file_sha256(Path(model.path)), "magmadnn_version": __version__,
            "task": saved.task,
            "inputs": inputs, "unseen_categories": saved.encoder.unseen,
            "outputs": {"columns": model.columns(model.task != "regression").names,
                        "labels": [str(c) for c in saved.classes] if model.task != "regression" else None},
            "metrics": _run_metrics(Path(model.path), saved.metrics) or saved.metrics}


def _run_metrics(path: Path, recorded: dict[str, Any]) -> dict[str, Any] | None:
    """The run's metrics.json beside the model file (its scores on each split), where it is this
    run's (the same data sha256 as the model records); None otherwise."""
    found = json_object(RunFolder(path.parent).metrics)
    return found if found and found.get("data_sha256") == recorded.get("data_sha256") \
        and found.get("name") == recorded.get("name") else None


def status_of(exc: BaseException) -> int:
    """The HTTP status of an error: 400 for a body the endpoint does not take, 422 for rows that do
    not fit the model (the message `predict` gives), 500 for anything else (a bug)."""
    if isinstance(exc, BadRequest):
        return 400
    if isinstance(exc, MagmaError):
        return 422
    return 500
