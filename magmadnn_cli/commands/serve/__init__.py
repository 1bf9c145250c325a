"""`magmadnn serve MODEL`: a saved model behind HTTP, on FastAPI and uvicorn (the `serve` extra).
POST /predict and /invocations (MLflow's scoring protocol) take JSON records, dataframe_split,
dataframe_records or CSV text and answer what `predict` writes; GET /health, /ready, /metadata and
/metrics (Prometheus). Bounded (body size, time per request), local unless told, optionally behind a
bearer token; SIGTERM or Ctrl-C finish the requests in flight and end it (exit 0).

The package: this command's entry (`serve`: options checked, the model loaded, the socket bound, the
server run until stopped); `app` (the ASGI app: endpoints, token, limits); `batching` (the model's
thread: requests gathered and answered); `bodies` (a request body as a table); `compiled` (a
request's rows encoded by the model's encoding compiled once); `metrics` (/metrics); `metadata`
(/metadata); `images` (an image model: its input described, table rows and text fields refused)."""

import contextlib
import ctypes
import gc
import signal
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from ...errors import MagmaError
from ...inference import Predictor
from ...training.run_folder import RunFolder
from .app import Limits, app
from .batching import Service
from .metrics import Metrics

LOCAL = ("127.0.0.1", "localhost", "::1")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


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
    _heap_kept()
    service.start()
    try:
        with _stop_signals(server), _frozen():  # from here on a stop signal ends `run` (exit 0)
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


def _heap_kept() -> None:
    """Arrays of 128 KB or more (a 256-row body's bytes, the scan's masks and positions) taken from
    the heap and left there between requests, not fresh pages each time: glibc maps them anew past its
    mmap threshold and trims the heap's top after each request, a page fault per 4 KB (0.1-0.3 ms an
    array here; docs/performance.md). A no-op where the C library has no `mallopt`."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 64 << 20)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _frozen() -> Iterator[None]:
    """The objects alive now (the libraries, the model: some 85,000) left out of the garbage
    collector's passes while serving: a full pass over them took 40-150 ms, a pause every request
    in flight then waited through (`gc.freeze`, as servers that fork workers use it)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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
