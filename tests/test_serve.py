"""`magmadnn serve` as clients use it: a real uvicorn server (the CLI, in a subprocess) on a loopback
port, real HTTP requests; answers equal `predict --proba`'s, every error an answer with predict's
message, the body and time bounds, the token, concurrent clients, SIGTERM draining."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from magmadnn_cli.files import file_sha256
from serve_helpers import HEART_NAMES, csv_text, digits_rows, heart_rows, predicted, records, train_models


class Server:
    """`magmadnn serve MODEL --port 0 ARGS` in a subprocess, ready (its /ready answered 200)."""

    def __init__(self, model: Path, *args: str, ready: bool = True) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        self.process = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", "serve", str(model), "--port", "0",
                                         *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                        stdin=subprocess.DEVNULL)
        self.said: list[str] = []
        for line in self.process.stderr:  # ends when the server ends (a mistake: exit 2)
            self.said.append(line)
            if line.startswith("serving "):
                self.host, self.port = line.split("http://", 1)[1].split(" ", 1)[0].rsplit(":", 1)
                break
        assert hasattr(self, "port"), "".join(self.said)
        threading.Thread(target=lambda: self.said.extend(self.process.stderr), daemon=True).start()
        deadline = time.monotonic() + 30
        while ready and self.call("GET", "/ready", headers=self._token_header(args))[0] != 200:
            assert time.monotonic() < deadline and self.process.poll() is None, "".join(self.said)
            time.sleep(0.02)  # polling a condition with a deadline, not waiting a fixed time

    @staticmethod
    def _token_header(args: tuple[str, ...]) -> dict[str, str]:
        if "--token-file" not in args:
            return {}
        return {"Authorization": f"Bearer {Path(args[args.index('--token-file') + 1]).read_text().strip()}"}

    def call(self, method: str, path: str, body: bytes | str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        connection = HTTPConnection(self.host, int(self.port), timeout=60)
        try:
            connection.request(method, path, body=body.encode() if isinstance(body, str) else body,
                               headers=headers or {}, encode_chunked="Transfer-Encoding" in (headers or {}))
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def post(self, path: str, payload, content_type: str = "application/json", **headers: str):
        body = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
        status, _, data = self.call("POST", path, body, {"Content-Type": content_type, **headers})
        return status, json.loads(data) if data[:1] in (b"{", b"[") else data.decode()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return train_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def heart(models):
    server = Server(models["heart"], "--max-wait-ms", "20")
    yield server
    assert server.stop() == 0, "".join(server.said)


@pytest.fixture(scope="module")
def digits(models):
    server = Server(models["digits"])
    yield server
    assert server.stop() == 0, "".join(server.said)


def as_text(predictions: list) -> list[list[str]]:
    """JSON predictions (records with proba) as predict's CSV rows; floats compared as the doubles."""
    return [[str(v) for v in row.values()] for row in predictions]


def assert_same(answer: list[dict], expected: list[list[str]]) -> None:
    assert len(answer) == len(expected)
    for got, want in zip(answer, expected):
        values = list(got.values())
        assert str(values[0]) == want[0]
        assert [float(v) for v in values[1:]] == [float(v) for v in want[1:]]  # the same float32 digits


@pytest.mark.parametrize("name", ["heart", "digits"])
def test_every_form_answers_as_predict_does(request, models, name, capsys, tmp_path):
    server = request.getfixturevalue(name)
    names, rows = (HEART_NAMES, heart_rows(count=30, start=160)) if name == "heart" else digits_rows(count=30)
    expected = predicted(capsys, models[name], tmp_path, names, rows)
    body = records(names, rows)
    split = {"columns": names, "data": [list(r.values()) for r in body]}
    for path, payload, kind in (("/predict?proba=true", body, "application/json"),
                                ("/invocations?proba=true", {"dataframe_split": split}, "application/json"),
                                ("/invocations?proba=true", {"dataframe_records": body}, "application/json"),
                                ("/predict?proba=true", csv_text(names, rows), "text/csv")):
        status, answer = server.post(path, payload, kind)
        assert status == 200, answer
        assert_same(answer["predictions"], expected)
    status, answer = server.post("/predict", body)
    assert answer["predictions"] == [type(answer["predictions"][0])(row[0]) for row in expected]
    first = server.post("/predict", body[:1])[1]["predictions"]
    assert first == answer["predictions"][:1]
    status, text = server.post("/predict?proba=true", body, Accept="text/csv")
    data = tmp_path / "rows.csv"
    assert text == subprocess.run([sys.executable, "-m", "magmadnn_cli", "predict", str(models[name]), str(data),
                                   "--proba"], capture_output=True, text=True, check=True).stdout


def test_bad_input_is_an_answer_with_predicts_message(heart, models, capsys, tmp_path):
    rows = records(HEART_NAMES, heart_rows(count=3))
    assert heart.post("/predict", "{not json")[0] == 400
    assert heart.post("/predict", b"\xff\xfe", "text/csv")[0] == 400
    assert heart.post("/predict", "age\n1\n", "application/xml")[0] == 400
    status, answer = heart.post("/predict", [dict(r, chol=1e39) for r in rows])
    assert status == 422 and "column 'chol', data row 1: inf is not a finite number" in answer["error"]
    status, answer = heart.post("/predict", [r if i != 1 else dict(r, chol="high") for i, r in enumerate(rows)])
    assert status == 422, answer
    data = tmp_path / "bad.csv"
    data.write_text(csv_text(HEART_NAMES, [[c if j != 4 else "high" for j, c in enumerate(r)] if i == 1 else r
                                           for i, r in enumerate(heart_rows(count=3))]))
    from conftest import run_cli
    code, _, err = run_cli(capsys, "predict", models["heart"], data)
    assert code == 2 and " ".join(answer["error"].split()[1:]) == " ".join(err.split()[2:])  # past the source
    status, answer = heart.post("/predict", [{k: v for k, v in r.items() if k != "thal"} for r in rows])
    assert status == 422 and answer["error"].startswith("request: missing feature column(s) thal")
    status, answer = heart.post("/predict", [dict(r, id=1) for r in rows])
    assert status == 422 and "unknown column(s) 'id'" in answer["error"]
    assert "Traceback" not in "".join(heart.said)
    assert heart.call("GET", "/health")[0] == 200  # the server goes on


def test_body_and_time_bounds(models):
    server = Server(models["heart"], "--max-body-mb", "0.01", "--timeout-s", "0.001")
    try:
        big = records(HEART_NAMES, heart_rows(count=200)) * 2
        status, answer = server.post("/predict", big)
        assert status == 413 and "--max-body-mb 0.01" in answer["error"]
        status, _, data = server.call("POST", "/predict", iter([json.dumps(big).encode()]),
                                      {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        assert status == 413, data  # no Content-Length: counted as it arrives
        status, answer = server.post("/predict", records(HEART_NAMES, heart_rows(count=40)))
        assert status == 504 and "--timeout-s 0.001" in answer["error"]
        assert server.call("GET", "/health")[0] == 200
    finally:
        assert server.stop() == 0


def test_the_token_guards_every_endpoint_but_health(models, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    server = Server(models["heart"], "--token-file", str(token))
    try:
        body = records(HEART_NAMES, heart_rows(count=2))
        assert server.call("GET", "/health")[0] == 200
        for path in ("/ready", "/metadata", "/metrics"):
            assert server.call("GET", path)[0] == 401
        assert server.post("/predict", body)[0] == 401
        assert server.post("/predict", body, Authorization="Bearer wrong")[0] == 401
        assert server.post("/predict", body, Authorization="Bearer s3cret-token")[0] == 200
    finally:
        assert server.stop() == 0


def test_concurrent_clients_each_get_their_own_answer(heart):
    rows = records(HEART_NAMES, heart_rows(count=64, start=0))
    alone = [heart.post("/predict?proba=true", [row])[1]["predictions"] for row in rows]
    before = metric(heart, "magmadnn_batch_rows_count")
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda row: heart.post("/predict?proba=true", [row])[1]["predictions"], rows * 4))
    assert together == alone * 4
    batches = metric(heart, "magmadnn_batch_rows_count") - before
    assert batches < len(together)  # some batches took several requests


def metric(server: Server, name: str) -> float:
    text = server.call("GET", "/metrics")[2].decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.split("{")[0].split()[0] == name)


def test_metadata_and_metrics(heart, models):
    status, _, data = heart.call("GET", "/metadata")
    meta = json.loads(data)
    assert meta["sha256"] == file_sha256(models["heart"]) and meta["task"] == "binary"
    inputs = {i["name"]: i for i in meta["inputs"]}
    assert inputs["cp"]["type"] == "category" and inputs["cp"]["categories"] == ["1", "2", "3", "4"]
    assert inputs["ca"]["missing"].startswith("filled: median")
    assert meta["outputs"] == {"columns": ["prediction", "prob_absent", "prob_present"], "labels": ["absent", "present"]}
    assert "accuracy" in meta["metrics"]["test"]
    heart.post("/predict", "{", "application/json")
    text = heart.call("GET", "/metrics")[2].decode()
    assert 'magmadnn_requests_total{endpoint="/predict",status="400"}' in text
    assert metric(heart, "magmadnn_rows_total") > 0 and metric(heart, "magmadnn_requests_in_flight") == 1
    assert 'magmadnn_request_seconds_bucket{endpoint="/predict",le="+Inf"}' in text


def test_sigterm_answers_requests_in_flight_then_exits_0(models):
    server = Server(models["heart"])
    body = records(HEART_NAMES, heart_rows(count=300, start=0)) * 100  # ~30,000 rows: a second or so
    result = {}
    client = threading.Thread(target=lambda: result.update(answer=server.post("/predict", body)))
    client.start()
    deadline = time.monotonic() + 30
    while metric(server, "magmadnn_requests_in_flight") < 2:  # the big request and this one
        assert time.monotonic() < deadline
    assert server.stop() == 0, "".join(server.said)
    client.join()
    status, answer = result["answer"]
    assert status == 200 and len(answer["predictions"]) == len(body)
    assert "stopped: every request in flight was answered" in "".join(server.said)


def test_mistakes_end_the_command_with_one_line(models, tmp_path):
    for args, message in ((["--token-file", str(tmp_path / "none")], "--token-file"),
                          (["--max-body-mb", "0"], "--max-body-mb: expected a number above 0"),
                          (["--host", "203.0.113.7"], "cannot listen on 203.0.113.7")):
        result = subprocess.run([sys.executable, "-m", "magmadnn_cli", "serve", str(models["heart"]), "--port", "0",
                                 *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_listening_beyond_loopback_is_said(models):
    server = Server(models["heart"], "--host", "0.0.0.0", ready=False)
    try:
        assert any("warning: listening on 0.0.0.0" in line and "anyone who reaches it" in line for line in server.said)
    finally:
        assert server.stop() == 0


def test_without_the_extra_the_fix_is_named(monkeypatch, models):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    from magmadnn_cli.commands.serve import serve
    from magmadnn_cli.errors import MagmaError
    with pytest.raises(MagmaError, match=r"pip install 'magmadnn-cli\[serve\]'"):
        serve(models["heart"])
