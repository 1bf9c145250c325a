"""What a request waits on in `magmadnn serve` (issue 47, p99 under load): a batch waits (at most
--max-wait-ms) only for requests on their way, whose bodies the server is reading, never for nobody; and
the objects alive once the server is loaded are left out of the garbage collector's passes."""

from __future__ import annotations

import gc
import json
import threading

import pytest

from magmadnn_cli.commands.serve import _frozen
from magmadnn_cli.commands.serve.batching import Job, Metrics, Service
from magmadnn_cli.inference import Predictor
from serve_helpers import HEART_NAMES, heart_rows, records, train_models
from test_serve_asgi import call, served  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def heart(tmp_path_factory):
    return train_models(tmp_path_factory.mktemp("models"), only=("heart",))["heart"]


def job(done: threading.Event, answers: list) -> Job:
    body = json.dumps(records(HEART_NAMES, heart_rows(count=1))).encode()
    return Job(body, "application/json", False, lambda rows, exc: answers.append((rows, exc)) or done.set())


def started(heart, max_wait: float) -> tuple[Service, list[int]]:
    service = Service(Predictor(heart, "cpu"), 1024, max_wait, Metrics())
    batches: list[int] = []
    service.metrics.batch = batches.append  # type: ignore[method-assign]
    service.start()
    return service, batches


def test_a_lone_request_is_not_held_for_the_wait(heart):
    service, batches = started(heart, 60.0)  # a wait far past the event's bound below
    try:
        done, answers = threading.Event(), []
        service.submit(job(done, answers))
        assert done.wait(20), "held for --max-wait-ms with no request on its way"
        assert answers[0][1] is None and batches == [1]
    finally:
        service.stop()


def test_a_request_on_its_way_joins_the_batch(heart, monkeypatch):
    service, batches = started(heart, 60.0)
    gathered = threading.Event()
    parsed = Service._parsed
    monkeypatch.setattr(Service, "_parsed", lambda self, j: (parsed(self, j), gathered.set())[0])
    try:
        first, second, answers = threading.Event(), threading.Event(), []
        with service.receiving():  # the second request's body is being read
            service.submit(job(first, answers))
            assert gathered.wait(20)
            service.submit(job(second, answers))
        assert first.wait(20) and second.wait(20)
        assert batches == [2] and all(exc is None for _, exc in answers)
    finally:
        service.stop()


def test_the_wait_for_a_request_that_never_comes_is_bounded(heart):
    service, batches = started(heart, 0.2)
    try:
        done, answers = threading.Event(), []
        with service.receiving():  # a body that never ends (or is refused): the batch goes at max_wait
            service.submit(job(done, answers))
            assert done.wait(20)
        assert batches == [1]
    finally:
        service.stop()


def test_every_request_leaves_the_count_of_those_on_their_way(served):  # noqa: F811
    asgi, _, service = served
    body = json.dumps(records(HEART_NAMES, heart_rows(count=3))).encode()
    answers = [call(asgi, "POST", "/predict", body, chunks=3), call(asgi, "POST", "/predict", b"[{"),
               call(asgi, "POST", "/predict", body * 200, chunks=4), call(asgi, "POST", "/predict?proba=true", body)]
    assert [status for status, _, _ in answers] == [200, 400, 413, 200]
    assert service.arriving == 0


def test_objects_alive_while_serving_are_left_out_of_collections():
    gc.unfreeze()
    with _frozen():
        assert gc.get_freeze_count() > 1000
        assert gc.get_count()[0] < 100  # collected just before
    assert gc.get_freeze_count() == 0
