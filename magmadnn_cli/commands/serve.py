"""`magmadnn serve MODEL`: a saved model behind HTTP, on FastAPI and uvicorn (the `serve` extra).
POST /predict and /invocations (MLflow's scoring protocol) take JSON records, dataframe_split,
dataframe_records or CSV text and answer what `predict` writes; GET /health, /ready, /metadata and
/metrics (Prometheus). Bounded (body size, time per request), local unless told, optionally behind a
bearer token; SIGTERM or Ctrl-C finish the requests in flight and end it (exit 0)."""

import asyncio
import contextlib
import hmac
import io
import json
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import parse_qsl

import numpy as np

from ..data.writers import Columns, write_rows
from ..errors import MagmaError
from ..inference import Predictor
from ..training.run_folder import RunFolder
from .serving import SOURCE, Job, Metrics, Service, metadata, status_of

ENDPOINTS = ("/predict", "/invocations", "/health", "/ready", "/metadata", "/metrics")
LOCAL = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Limits:
    max_body_mb: float  # as given; the bytes: `max_body`
    timeout: float      # seconds per request, from its body read to its answer
    token: str | None   # the bearer token every endpoint but /health needs (None: none)

    @property
    def max_body(self) -> int:
        return int(self.max_body_mb * 2**20)


def serve(model_path: Path, host: str = "127.0.0.1", port: int = 8080, max_batch_rows: int = 1024,
          max_wait_ms: float = 5.0, max_body_mb: float = 16.0, timeout_s: float = 30.0,
          token_file: Path | None = None, device: str = "auto", say: Callable[[str], None] = print,
          warn: Callable[[str], None] = print) -> None:
    """Serve the model (a file or a run folder) until SIGTERM or Ctrl-C; the model is loaded and
    the address bound before anything is said, so their mistakes end the command at once (exit 2)."""
    uvicorn = _web()
    _check(max_batch_rows, max_wait_ms, max_body_mb, timeout_s)
    limits = Limits(max_body_mb, timeout_s, _token(token_file) if token_file is not None else None)
    model = Predictor(RunFolder.model_file(model_path), device)
    metrics = Metrics()
    service = Service(model, max_batch_rows, max_wait_ms / 1000, metrics)
    sock = _listen(host, port)
    server = _server_class(uvicorn)(uvicorn.Config(app(service, limits), log_level="warning", access_log=False,
                                                   lifespan="off", proxy_headers=False, timeout_graceful_shutdown=timeout_s + 5))
    where = sock.getsockname()
    url = f"http://{'[' + where[0] + ']' if ':' in where[0] else where[0]}:{where[1]}"
    if host not in LOCAL:
        warn(f"listening on {host} ({url}): reachable from other machines"
             + ("" if limits.token else "; anyone who reaches it can use the model (--token-file asks for a token)"))
    service.start()
    try:
        with _stop_signals(server):  # from here on a stop signal ends `run` (exit 0)
            say(f"serving {model.path} on {url} (POST /predict, /invocations; GET /health, /ready, /metadata, "
                "/metrics); Ctrl-C stops")
            server.run(sockets=[sock])
    finally:
        service.stop()
        sock.close()
    say("stopped: every request in flight was answered")


def _web() -> Any:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise MagmaError(f"magmadnn serve needs FastAPI and uvicorn ({exc.name} is not installed): "
                         "pip install 'magmadnn-cli[serve]'") from None
    return uvicorn


def _check(max_batch_rows: int, max_wait_ms: float, max_body_mb: float, timeout_s: float) -> None:
    for name, value in (("--max-batch-rows", max_batch_rows), ("--max-body-mb", max_body_mb),
                        ("--timeout-s", timeout_s)):
        if not value > 0:
            raise MagmaError(f"{name}: expected a number above 0; received {value:g}")
    if not max_wait_ms >= 0:
        raise MagmaError(f"--max-wait-ms: expected 0 or more; received {max_wait_ms:g}")


def _token(path: Path) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise MagmaError(f"--token-file {path}: cannot read it ({exc}); give a file holding the token, one line")
    if not token or any(c.isspace() for c in token):
        raise MagmaError(f"--token-file {path}: expected one token (no spaces) on one line; the file holds "
                         + ("nothing" if not token else "text with spaces"))
    return token


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: a free one), or the reason it cannot be."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        raise MagmaError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port (or "
                         "--host)") from None
    return sock


def _server_class(uvicorn: Any) -> Any:
    class Server(uvicorn.Server):
        """uvicorn's server, whose stop signals `_stop_signals` takes: they end `run` once the requests
        in flight are answered (uvicorn's own would raise them again after, an exit of 128 + signal)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield
    return Server


@contextlib.contextmanager
def _stop_signals(server: Any) -> Iterator[None]:
    """SIGINT and SIGTERM ask `server` to stop (a second SIGINT: at once), the handlers before
    restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
        try:
            body = await _body(receive)
        except BodyTooLarge:
            return 413, _too_large(self.limits), []
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        try:
            rows = await asyncio.wait_for(_submitted(self.service, body, content_type, proba), self.limits.timeout)
        except asyncio.TimeoutError:
            return 504, (f"{SOURCE}: not answered within --timeout-s {self.limits.timeout:g} s; send fewer rows a "
                         "request, or start the server with a larger --timeout-s"), []
        except Exception as exc:  # noqa: BLE001  every error is an answer; the server goes on
            status = status_of(exc)
            return status, str(exc) if status < 500 else f"internal error: {type(exc).__name__}: {exc}", []
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


async def _submitted(service: Service, body: bytes, content_type: str, proba: bool) -> np.ndarray:
    """The output rows of one request, from the model's thread (cancelled there if it times out)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(rows: np.ndarray | None, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(rows)

    job = Job(body, content_type, proba, lambda rows, exc: loop.call_soon_threadsafe(settle, rows, exc))
    service.submit(job)
    try:
        return await future
    finally:
        job.cancelled = True  # answered, or given up on (timed out): nothing more to do for it


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
