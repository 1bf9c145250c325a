"""What `magmadnn serve` runs behind its HTTP layer: the model's own thread, which takes requests in
batches (up to --max-batch-rows rows, waiting at most --max-wait-ms for more) and answers each exactly
as it would alone. No web framework here."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ...data.columns import RawColumns
from ...data.readers import Table
from ...inference import Predictor, new_tally, read_spec
from .bodies import SOURCE, parse
from .compiled import Compiled
from .metrics import Metrics

POLL = 0.001  # seconds between looks at whether a request is still on its way


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
    x: np.ndarray | None = None  # its rows encoded (the network's inputs), once they are

    def parse(self, spec: Any, compiled: Compiled) -> int:
        """The body read into its table (and its rows encoded, where the compiled encoding took it);
        returns its row count."""
        self.table, self.x = parse(self, spec, compiled)
        return len(self.table.x)


class Service:
    """The model and its thread. Requests are queued (`submit`); the thread parses each and gathers
    up to `max_rows` rows (waiting at most `max_wait` seconds for more). A batch's rows are encoded
    together (row by row exact: lookups and elementwise arithmetic) and their answers formatted
    together; the network runs once per request, on that request's rows (in the memory layout their
    own encoding gives), as `predict` runs it on a file of them, so an answer is exactly what the
    request alone gets whatever else is queued (BLAS sums a row differently in a batch of another
    shape or layout: a merged network batch would change answers in their 7th digit). A request the
    model's compiled encoding takes (`Compiled`) comes encoded from its parse; a batch whose
    encoding fails is answered request by request (each its own error or answer)."""

    def __init__(self, model: Predictor, max_rows: int, max_wait: float, metrics: "Metrics") -> None:
        self.model, self.max_rows, self.max_wait, self.metrics = model, max_rows, max_wait, metrics
        self.arriving = 0  # requests whose body is being read, not yet submitted (`receiving`)
        self.ready = threading.Event()
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="magmadnn-model", daemon=True)
        with model.using():
            self.spec = read_spec(model.path, model.saved, False)
        self.compiled = Compiled(model, self.spec)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Ends the thread once the requests queued before are answered."""
        self.jobs.put(None)
        self.thread.join()

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    @contextlib.contextmanager
    def receiving(self) -> Iterator[None]:
        """Around a request's body read and `submit`: a batch waits (at most max_wait) only for
        requests on their way (used from the event loop's thread only)."""
        self.arriving += 1
        try:
            yield
        finally:
            self.arriving -= 1

    def _run(self) -> None:
        with self.model.using():
            self._warm_up()
            self.ready.set()
            while (batch := self._gather()) is not None:
                jobs = [job for job in batch if job.table is not None and not job.cancelled]
                self.metrics.batch(sum(len(job.table.x) for job in jobs))
                self._encode_together([job for job in jobs if job.x is None])
                self._answer_together(jobs)

    def _warm_up(self) -> None:
        """One batch through the network (a row of zeros), so the first request is not the slow one."""
        shape = (1,) + tuple(self.model.saved.sample_shape)
        self.model.outputs(np.zeros(shape, self.spec.dtype), "warm-up", lambda rows: [int(r) + 1 for r in rows])

    def _gather(self) -> list[Job] | None:
        """The next batch: the first request queued, then those queued meanwhile and those on their way
        (`receiving`) within max_wait, while the rows stay under max_rows (None: stop). With none on
        its way the batch waits for nobody: the network runs per request, so a wait buys little."""
        first = self.jobs.get()
        if first is None:
            return None
        batch, rows = [first], self._parsed(first)
        deadline = time.monotonic() + self.max_wait
        while rows < self.max_rows:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                left = deadline - time.monotonic()
                if not self.arriving or left <= 0:
                    break
                try:
                    job = self.jobs.get(timeout=min(left, POLL))
                except queue.Empty:
                    continue
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
            return job.parse(self.spec, self.compiled)
        except Exception as exc:  # noqa: BLE001 (answered: a bad request never stops the thread)
            job.answer(None, exc)
            return 0

    def _encode_together(self, jobs: list[Job]) -> None:
        """Two or more jobs' rows encoded as one table, each job's rows set apart (`x`); where the
        encoding fails, none is (each is answered alone: its own message)."""
        tables: list[Table] = [job.table for job in jobs]  # type: ignore[misc]  (parsed: tables)
        table = merged(tables) if len(jobs) > 1 else None
        try:
            x = self.model.encoded(table, False, new_tally()) if table is not None else None
        except Exception:  # noqa: BLE001  (answered later, each request alone: its own message)
            return
        if x is None:
            return
        ends = np.cumsum([len(t.x) for t in tables])
        for job, part, end in zip(jobs, tables, ends):
            job.x = x[end - len(part.x):end].copy(order="K")  # laid out as encoding it alone lays it out

    def _answer_together(self, jobs: list[Job]) -> None:
        """The encoded jobs' answers formatted at once, the network run on each job's rows alone; a
        job not encoded is answered alone."""
        outputs, answered = [], []
        for job in jobs:
            if job.x is None:
                self._answer(job)
                continue
            try:
                outputs.append(self.model.table_outputs(job.x, job.table))  # type: ignore[arg-type]
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
