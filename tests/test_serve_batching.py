"""The serve model thread's batches (commands/serve/batching.Service, in-process): requests gathered together
are encoded once and formatted once, the network run on each request's rows alone, so every answer is
`predict --proba`'s for that request's rows; a bad request among them gets its own message. And the
memory budget every request asks for is read from /proc once, not on every call."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from magmadnn_cli.commands.serve.batching import Job, Metrics, Service
from magmadnn_cli.core import backend as B
from magmadnn_cli.inference import Predictor
from serve_helpers import HEART_NAMES, csv_text, digits_rows, heart_rows, predicted, records, train_models


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return train_models(tmp_path_factory.mktemp("models"))


def answered_together(model: Predictor, bodies: list[tuple[object, bool]]) -> list[tuple]:
    """Each (payload, proba) as a request, all queued before the model's thread starts (one batch)."""
    service = Service(model, 100_000, 0.0, Metrics())
    results: list[tuple] = [()] * len(bodies)
    left = [len(bodies)]
    done = threading.Event()

    def answer(i: int):
        def settle(rows, exc) -> None:
            results[i] = (rows, exc)
            left[0] -= 1
            if not left[0]:
                done.set()
        return settle
    for i, (payload, proba) in enumerate(bodies):
        csv = isinstance(payload, str)  # CSV text, else JSON
        service.submit(Job((payload if csv else json.dumps(payload)).encode(), "text/csv" if csv else "application/json",
                           proba, answer(i)))
    service.start()
    try:
        assert done.wait(120)
    finally:
        service.stop()
    return results


@pytest.mark.parametrize("form", ["json", "csv", "quoted csv"])
@pytest.mark.parametrize("name", ["heart", "digits"])
def test_requests_batched_together_answer_as_predict_does_alone(models, name, form, capsys, tmp_path, monkeypatch):
    names, rows = (HEART_NAMES, heart_rows(count=60, start=0)) if name == "heart" else digits_rows(count=60)
    sizes = [1, 3, 1, 7, 1, 2, 16, 1, 5, 1, 19, 1]  # 58 rows: requests of many sizes, in one batch
    ends = np.cumsum(sizes)
    parts = [rows[end - size:end] for size, end in zip(sizes, ends)]
    encodes = []
    encoded = Predictor.encoded  # the encoding `predict` runs, shared (not rebuilt in serving)
    monkeypatch.setattr(Predictor, "encoded", lambda self, *a: encodes.append(len(a[0].x)) or encoded(self, *a))
    model = Predictor(models[name], "cpu")
    bodies = [records(names, part) if form == "json" else csv_text(names, part) for part in parts]
    if form == "quoted csv":  # a quote: the CSV line reader's (the general path)
        bodies = [body.replace(names[0], f'"{names[0]}"', 1) for body in bodies]
    results = answered_together(model, [(body, i % 3 != 1) for i, body in enumerate(bodies)])
    # each request encoded by the model's compiled encoding as it is parsed (JSON; CSV for a model with
    # category columns), or the whole batch's rows encoded at once by the general path
    compiled = form == "json" or (form == "csv" and name == "heart")
    assert encodes == ([] if compiled else [sum(sizes)])
    for i, (part, (got, exc)) in enumerate(zip(parts, results)):
        assert exc is None
        alone = predicted(capsys, models[name], tmp_path, names, part, proba=i % 3 != 1)
        assert got.tolist() == alone  # the same text, to the last digit


def test_a_bad_request_in_a_batch_gets_its_own_message(models, capsys, tmp_path):
    rows = heart_rows(count=6, start=0)
    good = records(HEART_NAMES, rows)
    bad = [dict(good[0]), dict(good[1], chol=1e39)]  # row 2: beyond float32
    model = Predictor(models["heart"], "cpu")
    results = answered_together(model, [(good[:3], True), (bad, True), ([dict(good[0], cp=9)], False),
                                        (good[3:], True)])
    assert results[0][0].tolist() == predicted(capsys, models["heart"], tmp_path, HEART_NAMES, rows[:3])
    assert results[3][0].tolist() == predicted(capsys, models["heart"], tmp_path, HEART_NAMES, rows[3:])
    assert results[1][0] is None and "column 'chol', data row 2: inf is not a finite number" in str(results[1][1])
    assert results[2][1] is None and results[2][0].shape == (1, 1)  # an unseen category: zeros, answered


def test_the_memory_budget_is_read_once_while_the_process_stays_put(monkeypatch):
    reads = []
    monkeypatch.setattr(B, "_host_bounds", lambda: reads.append(1) or [(1 << 30, "the machine's free memory")])
    clock, peak = [1000.0], [50_000]
    monkeypatch.setattr(B.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(B, "_peak_memory", lambda: peak[0])
    monkeypatch.setattr(B, "_LAST_READ", B._BoundsRead())
    assert [B.host_memory_available() for _ in range(50)] == [1 << 30] * 50
    assert len(reads) == 1
    peak[0] += 1  # the process grew: read again
    B.host_memory_available()
    clock[0] += B.BUDGET_SECONDS  # time passed: read again
    B.host_memory_available()
    assert len(reads) == 3



def test_multilabel_answers_with_and_without_probabilities_batched_together(capsys, tmp_path):
    """A multi-label answer without probabilities (the set and a 0/1 column per label) is not a prefix of
    one with them: each request in a mixed batch gets its own columns."""
    from conftest import ROOT, train_on
    run = train_on(tmp_path / "run", ["training.epochs=1"], config=ROOT / "configs" / "digits_multilabel.yaml")
    names, rows = digits_rows(count=9)
    parts = [rows[:4], rows[4:]]
    model = Predictor(run / "model.npz", "cpu")
    results = answered_together(model, [(records(names, part), proba) for part, proba in zip(parts, (True, False))])
    for part, proba, (got, exc) in zip(parts, (True, False), results):
        assert exc is None
        assert got.tolist() == predicted(capsys, run / "model.npz", tmp_path, names, part, proba=proba)
