"""`magmadnn serve`'s ASGI layer, driven in-process (no sockets): POST /predict and /invocations are
answered before FastAPI (its router and middleware cost more than the model on one row), with the
same answers and errors; every other path still reaches FastAPI."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")

from magmadnn_cli.commands.serve.app import Limits, app
from magmadnn_cli.commands.serve.batching import Metrics, Service
from magmadnn_cli.inference import Predictor
from serve_helpers import HEART_NAMES, csv_text, heart_rows, predicted, records, train_models


@pytest.fixture(scope="module")
def heart(tmp_path_factory):
    return train_models(tmp_path_factory.mktemp("models"), only=("heart",))["heart"]


@pytest.fixture
def served(heart, monkeypatch):
    """The app over a started model thread; `reached` lists the paths FastAPI was asked for."""
    from fastapi import FastAPI
    reached: list[str] = []
    original = FastAPI.__call__

    async def spied(self, scope, receive, send):
        reached.append(scope["path"])
        await original(self, scope, receive, send)
    monkeypatch.setattr(FastAPI, "__call__", spied)
    service = Service(Predictor(heart, "cpu"), 1024, 0.0, Metrics())
    service.start()
    yield app(service, Limits(0.01, 30.0, None)), reached, service
    service.stop()


def call(asgi, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         chunks: int = 1) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through the ASGI app: (status, headers, body); the body sent in `chunks` parts."""
    path, _, query = path.partition("?")
    size = -(-len(body) // chunks) if body else 1
    parts = [body[i:i + size] for i in range(0, max(len(body), 1), size)]
    messages = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1} for i, part in enumerate(parts)]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query.encode(),
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080)}
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
    asyncio.run(asgi(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_predictions_are_answered_before_the_framework(served, heart, capsys, tmp_path):
    asgi, reached, _ = served
    rows = heart_rows(count=5)
    expected = predicted(capsys, heart, tmp_path, HEART_NAMES, rows)
    for path in ("/predict?proba=true", "/invocations?proba=true"):
        status, headers, body = call(asgi, "POST", path, json.dumps(records(HEART_NAMES, rows)).encode(),
                                     {"Content-Type": "application/json"})
        assert status == 200 and headers[b"content-type"] == b"application/json", body
        got = [list(r.values()) for r in json.loads(body)["predictions"]]
        assert [r[0] for r in got] == [e[0] for e in expected]
        assert [r[1:] for r in got] == [[float(v) for v in e[1:]] for e in expected]  # the same float32 digits
    status, headers, body = call(asgi, "POST", "/predict?proba=true", csv_text(HEART_NAMES, rows).encode(),
                                 {"Content-Type": "text/csv", "Accept": "text/csv"})
    assert status == 200 and headers[b"content-type"].startswith(b"text/csv")
    assert body.decode().splitlines()[1:] == [",".join(r) for r in expected]
    assert reached == []  # FastAPI was never asked
    assert call(asgi, "GET", "/health")[0] == 200 and reached == ["/health"]
    assert call(asgi, "GET", "/nowhere")[0] == 404


def test_errors_and_bounds_at_the_asgi_layer(served):
    asgi, reached, service = served
    assert call(asgi, "POST", "/predict", b"{not json", {"Content-Type": "application/json"})[0] == 400
    status, _, body = call(asgi, "POST", "/predict", json.dumps([{"age": 1}]).encode())
    assert status == 422 and json.loads(body)["error"].startswith("request: missing feature column(s) sex")
    big = json.dumps(records(HEART_NAMES, heart_rows(count=200))).encode()  # over 0.01 MB, sent without a length
    status, _, body = call(asgi, "POST", "/predict", big, {"Content-Type": "application/json"}, chunks=8)
    assert status == 413 and "--max-body-mb 0.01" in json.loads(body)["error"]
    status, headers, _ = call(asgi, "GET", "/predict")
    assert status == 405 and headers[b"allow"] == b"POST"
    assert reached == []
    text = service.metrics.text()
    for code in (400, 422, 413, 405):
        assert f'magmadnn_requests_total{{endpoint="/predict",status="{code}"}} 1' in text


def test_a_regression_model_refuses_proba(served, monkeypatch):
    asgi, _, service = served
    monkeypatch.setattr(type(service.model), "task", property(lambda self: "regression"))
    status, _, body = call(asgi, "POST", "/predict?proba=true", b"[]")
    assert status == 422 and "regression model" in json.loads(body)["error"]

