"""The ASGI app `serve` runs: `Guard` (bearer token, body size, the counters /metrics shows) around
`Predictions`, which answers POST /predict and /invocations itself (a router and its middleware cost
more than the model on a single row) and hands every other path to FastAPI (GET /health, /ready,
/metadata, /metrics)."""

import asyncio
import hmac
import io
import json
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qsl

import numpy as np

from ...data.writers import Columns, write_rows
from .batching import Job, Service
from .bodies import SOURCE, status_of
from .metadata import metadata
from .metrics import Metrics

ENDPOINTS = ("/predict", "/invocations", "/health", "/ready", "/metadata", "/metrics")


@dataclass(frozen=True)
class Limits:
    max_body_mb: float  # as given; the bytes: `max_body`
    timeout: float      # seconds per request, from its body read to its answer
    token: str | None   # the bearer token every endpoint but /health needs (None: none)

    @property
    def max_body(self) -> int:
        return int(self.max_body_mb * 2**20)


class BodyTooLarge(Exception):
    pass


PREDICT = ("/predict", "/invocations")


def app(service: Service, limits: Limits) -> Any:
    """The ASGI app: `Guard` (token, body size, metrics) around `Predictions`, which answers POST
    /predict and /invocations itself and hands every other path to a FastAPI app (GET /health,
    /ready, /metadata, /metrics; 404 for the rest)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, Response

    api = FastAPI(title="magmadnn serve", docs_url=None, redoc_url=None, openapi_url=None, **_no_telemetry(FastAPI))
    described = metadata(service.model)

    @api.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @api.get("/ready")
    async def ready() -> Response:
        done = service.ready.is_set()
        return JSONResponse({"ready": done}, status_code=200 if done else 503)

    @api.get("/metadata")
    async def meta() -> Response:
        return Response(json.dumps(described, default=str), media_type="application/json")

    @api.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(service.metrics.text(), media_type="text/plain; version=0.0.4")

    return Guard(Predictions(api, service, limits), service.metrics, limits)


def _no_telemetry(fastapi: Any) -> dict[str, Any]:
    """FastAPI's own OpenTelemetry hooks off (FastAPI 0.16x: they consult the environment on every
    request, a fifth of a single-row request's time; /metrics counts what a server needs)."""
    import inspect
    if "telemetry" not in inspect.signature(fastapi.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


class Predictions:
    """POST /predict and /invocations answered at the ASGI layer (a router and its middleware cost
    more than the model on a single row); any other request goes to `inner` (FastAPI). A request's
    rows are answered by the model's thread within the time limit; every error is an answer."""

    def __init__(self, inner: Any, service: Service, limits: Limits) -> None:
        self.inner, self.service, self.limits = inner, service, limits
        model = service.model
        self.columns = {proba: model.columns(proba) for proba in (False, True)}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] not in PREDICT:
            await self.inner(scope, receive, send)
        elif scope["method"] != "POST":
            await _reply(send, 405, f"{scope['path']} takes POST (a body of rows)", [(b"allow", b"POST")])
        else:
            await _reply(send, *await self._answer(scope, receive))

    async def _answer(self, scope: dict, receive: Callable) -> tuple[int, Any, list]:
        """(status, the answer's bytes or an error message, headers) for one request."""
        query = dict(parse_qsl(scope["query_string"].decode("latin-1")))
        proba = query.get("proba", "false").lower() in ("true", "1", "yes")
        if proba and self.service.model.task == "regression":
            return 422, "proba=true gives class probabilities; this is a regression model (leave it out)", []
        headers = dict(scope["headers"])
        with self.service.receiving():  # a batch being gathered waits for it
            try:
                body = await _body(receive)
            except BodyTooLarge:
                return 413, _too_large(self.limits), []
            job, answered = _submitted(self.service, body, headers.get(b"content-type", b"").decode("latin-1"), proba)
        try:
            rows = await asyncio.wait_for(answered, self.limits.timeout)
        except asyncio.TimeoutError:
            return 504, (f"{SOURCE}: not answered within --timeout-s {self.limits.timeout:g} s; send fewer rows a "
                         "request, or start the server with a larger --timeout-s"), []
        except Exception as exc:  # noqa: BLE001  every error is an answer; the server goes on
            status = status_of(exc)
            return status, str(exc) if status < 500 else f"internal error: {type(exc).__name__}: {exc}", []
        finally:
            job.cancelled = True  # answered, or given up on (timed out): nothing more to do for it
        return 200, *_answer(rows, self.columns[proba], headers.get(b"accept", b"").decode("latin-1"))


async def _body(receive: Callable) -> bytes:
    """The request's body, as its chunks arrive (an empty one if the client left)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _submitted(service: Service, body: bytes, content_type: str, proba: bool) -> tuple[Job, asyncio.Future]:
    """One request queued for the model's thread, and the future of its output rows (the job is
    cancelled there once its answer is given up on)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(rows: np.ndarray | None, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(rows)

    job = Job(body, content_type, proba, lambda rows, exc: loop.call_soon_threadsafe(settle, rows, exc))
    service.submit(job)
    return job, future


def _answer(rows: np.ndarray, columns: Columns, accept: str) -> tuple[bytes, list]:
    """The rows as `predict` writes them, and the headers: CSV for `Accept: text/csv`, else JSON:
    {"predictions": [values]} for one output column, [{column: value, ...}] for several (labels typed
    as in training)."""
    if "text/csv" in accept:
        out = io.BytesIO()
        write_rows(out, None, columns, [rows])
        return out.getvalue(), [(b"content-type", b"text/csv; charset=utf-8")]
    typed = [rows[:, j].astype({"float": float, "int": int}.get(kind, str)).tolist()
             for j, kind in enumerate(columns.kinds)]
    predictions = typed[0] if len(typed) == 1 else [dict(zip(columns.names, values)) for values in zip(*typed)]
    return json.dumps({"predictions": predictions}).encode(), [(b"content-type", b"application/json")]


def _error_body(status: int, message: str) -> dict[str, Any]:
    """Every error's answer: its message (predict's, for rows that do not fit) and status."""
    return {"error": message, "status": status}


def _too_large(limits: Limits) -> str:
    return (f"{SOURCE}: the body is larger than --max-body-mb {limits.max_body_mb:g}; send fewer rows a request, "
            "or start the server with a larger --max-body-mb")


class Guard:
    """ASGI middleware before every endpoint: the bearer token (all but /health), the body size
    (Content-Length, and the bytes as they arrive), the counters /metrics shows."""

    def __init__(self, inner: Any, metrics: Metrics, limits: Limits) -> None:
        self.inner, self.metrics, self.limits = inner, metrics, limits

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in ENDPOINTS else "other"
        status, start = [500], time.perf_counter()

        async def sent(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.metrics.in_flight += 1
        try:
            refusal = self._refusal(scope, path)
            if refusal is not None:
                await _reply(sent, *refusal)
            else:
                await self.inner(scope, self._bounded(receive), sent)
        finally:
            self.metrics.in_flight -= 1
            self.metrics.request(path, status[0], time.perf_counter() - start)

    def _refusal(self, scope: dict, path: str) -> tuple[int, str, list] | None:
        headers = dict(scope["headers"])
        if self.limits.token is not None and path != "/health":
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.limits.token}".encode()):
                return 401, ("no bearer token; send the header Authorization: Bearer <token> (the server's "
                             "--token-file)" if not given else "wrong bearer token"), [(b"www-authenticate", b"Bearer")]
        length = headers.get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limits.max_body:
            return 413, _too_large(self.limits), []
        return None

    def _bounded(self, receive: Callable) -> Callable:
        """`receive`, raising BodyTooLarge once the body exceeds the limit (a body sent in chunks)."""
        seen = [0]

        async def bounded() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.limits.max_body:
                    raise BodyTooLarge()
            return message
        return bounded


async def _reply(send: Callable, status: int, answer: str | bytes, headers: list) -> None:
    """An answer: `answer`'s bytes with `headers` (a 200), or the error message as JSON."""
    if isinstance(answer, str):
        answer, headers = json.dumps(_error_body(status, answer)).encode(), [(b"content-type", b"application/json"),
                                                                              *headers]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(answer)).encode()), *headers]})
    await send({"type": "http.response.body", "body": answer})
