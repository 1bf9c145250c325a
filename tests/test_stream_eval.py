"""`evaluate` streams (issue 48): a file over the memory budget (or any file, for a model trained with
data.stream: true) is scored chunk by chunk from sums (data/metrics.py's ClassSums, RegressionSums,
MultiLabelSums), giving the numbers of the whole file in memory, for classifiers, regression and
multi-label models, on CSV, Parquet and JSON Lines; its refusals are those of the in-memory path."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import run_cli
from magmadnn_cli.commands import evaluate as evaluate_command
from magmadnn_cli.core import backend as B
from magmadnn_cli.data import metrics
from magmadnn_cli.data.targets import target_task

ROWS = 900
LAYERS = {"classification": 3, "regression": 1, "multilabel": 2}
LOSSES = {"classification": "cross_entropy", "regression": "mse", "multilabel": "binary_cross_entropy"}


def _columns(task: str, rows: int = ROWS, seed: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(rows), rng.standard_normal(rows) * 3 + 5
    kind = np.array(["red", "green", "blue"])[rng.integers(0, 3, rows)]
    a[rng.random(rows) < 0.05] = np.nan
    score = np.nan_to_num(a) + (b - 5) / 3 + (kind == "red")
    if task == "classification":
        target = np.array(["low", "mid", "high"])[np.digitize(score, [-0.5, 0.7])]
    elif task == "regression":
        target = (100 + 20 * score + rng.standard_normal(rows)).round(4)
    else:
        target = np.array(["|", "up", "right", "right|up"])[(score > 0) + 2 * (kind == "blue")]
    return {"a": a, "b": b.round(5), "kind": kind, "target": target}


def _write(folder, task: str, kind: str, seed: int = 2):
    cols = _columns(task, seed=seed)
    path = folder / f"{task}{seed}.{kind}"
    if kind == "parquet":
        pq.write_table(pa.table(cols), path, row_group_size=64)
    elif kind == "jsonl":
        records = [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in
                    zip(cols, map(lambda c: c.item() if hasattr(c, "item") else c, row))} for row in zip(*cols.values())]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        lines = ["a,b,kind,target"] + [f"{'' if np.isnan(a) else f'{a:.6g}'},{b},{k},{t}"
                                       for a, b, k, t in zip(*cols.values())]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module", params=["classification", "regression", "multilabel"])
def model(request, tmp_path_factory):
    """A model of each task trained in memory on a CSV, and the folder holding it."""
    task, folder = request.param, tmp_path_factory.mktemp(request.param)
    cfg = {"name": task, "seed": 1, "device": "cpu",
           "data": {"train": str(_write(folder, task, "csv")), "target": "target", "validation_split": 0.2},
           "model": {"layers": [{"type": "dense", "units": 12, "activation": "tanh"},
                                {"type": "dense", "units": LAYERS[task],
                                 "activation": {"classification": "softmax", "multilabel": "sigmoid"}.get(task, "linear")}]},
           "loss": LOSSES[task], "optimizer": {"type": "adam", "learning_rate": 0.02},
           "training": {"epochs": 3, "batch_size": 32, "eval_batch_size": 50}}
    (folder / "c.yaml").write_text(yaml.safe_dump(cfg))
    import sys
    from magmadnn_cli import cli
    argv, sys.argv = sys.argv, ["magmadnn", "train", str(folder / "c.yaml"), "--out", str(folder / "run")]
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code, exc.code
    finally:
        sys.argv = argv
    return task, folder


def _scores(capsys, model_file, data, monkeypatch=None, budget: int | None = None, chunk_rows: int = 0):
    """evaluate --json's numbers and stderr; with `budget`, the memory budget is that many bytes."""
    if budget is not None:
        monkeypatch.setattr(B, "host_memory_available", lambda: budget)
    if chunk_rows:
        monkeypatch.setattr(evaluate_command, "EVALUATE_CHUNK_ROWS", chunk_rows)
    code, out, err = run_cli(capsys, "evaluate", model_file, data, "--json")
    assert code == 0, out + err
    return json.loads(out), err


def _same(streamed: dict, whole: dict) -> None:
    """Every count exactly; the loss and the regression scores up to float rounding."""
    assert streamed.keys() == whole.keys()
    for key, value in whole.items():
        if isinstance(value, float):
            assert streamed[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
        elif isinstance(value, list) and value and isinstance(value[0], float):
            np.testing.assert_allclose(streamed[key], value, rtol=1e-9)
        else:
            assert streamed[key] == value, key


@pytest.mark.parametrize("kind", ["csv", "parquet", "jsonl"])
def test_a_file_over_the_budget_is_scored_in_chunks_as_in_memory(capsys, monkeypatch, model, kind):
    task, folder = model
    data = _write(folder, task, kind, seed=7)  # new rows, not the training file
    whole, err = _scores(capsys, folder / "run" / "model.npz", data)
    assert "chunk(s)" not in err
    seen: list[int] = []
    encode = evaluate_command.encode
    monkeypatch.setattr(evaluate_command, "encode", lambda table, *a: seen.append(len(table.raw.x)) or encode(table, *a))
    streamed, err = _scores(capsys, folder / "run" / "model.npz", data, monkeypatch,
                            budget=data.stat().st_size * 3 // 2, chunk_rows=128)
    assert "evaluated in" in err and "chunk(s)" in err, err
    assert len(seen) >= ROWS // 128 and max(seen) <= 128 and sum(seen) == ROWS
    assert streamed["rows"] == ROWS and streamed["task"] == task
    _same(streamed, whole)


def test_a_model_trained_streamed_evaluates_streamed(capsys, monkeypatch, tmp_path):
    data = _write(tmp_path, "classification", "csv")
    cfg = {"name": "s", "seed": 1, "device": "cpu",
           "data": {"train": str(data), "target": "target", "stream": True, "validation_split": 0.2},
           "model": {"layers": [{"type": "dense", "units": 3, "activation": "softmax"}]},
           "loss": "cross_entropy", "optimizer": {"type": "adam", "learning_rate": 0.02},
           "training": {"epochs": 1, "batch_size": 32}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 0, out + err
    new = _write(tmp_path, "classification", "csv", seed=9)
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", new, "--json")
    assert code == 0 and "evaluated in 1 chunk(s)" in err, out + err
    assert json.loads(out)["rows"] == ROWS


def test_an_unknown_label_in_a_later_chunk_is_refused_as_in_memory(capsys, monkeypatch, model):
    task, folder = model
    if task != "classification":
        pytest.skip("one task is enough")
    data = _write(folder, task, "csv", seed=11)
    lines = data.read_text().splitlines()
    lines[700] = lines[700].rsplit(",", 1)[0] + ",huge"
    data.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(B, "host_memory_available", lambda: data.stat().st_size * 3 // 2)
    code, out, err = run_cli(capsys, "evaluate", folder / "run" / "model.npz", data)
    assert code == 2 and "'huge'" in err and "Traceback" not in err, out + err


@pytest.mark.parametrize("labels", [3, 60])
@pytest.mark.parametrize("cuts", [[1000], [1, 998, 1], [300, 300, 400]])
def test_class_sums_added_in_pieces_are_the_whole_report(labels, cuts):
    rng = np.random.default_rng(labels)
    truth, guess = rng.integers(0, labels, 1000), rng.integers(0, labels, 1000)
    guess = np.where(rng.random(1000) < 0.5, truth, guess)
    names = [f"c{i}" for i in range(labels)]
    sums = metrics.ClassSums(names)
    for lo, hi in zip(np.cumsum([0] + cuts[:-1]), np.cumsum(cuts)):
        sums.add(truth[lo:hi], guess[lo:hi])
    whole = metrics.classification_report(truth, guess, names)
    assert sums.report() == whole
    if labels <= metrics.CONFUSION_MAX_CLASSES:  # against an independent count
        expected = np.zeros((labels, labels), int)
        np.add.at(expected, (truth, guess), 1)
        assert whole["confusion_matrix"] == expected.tolist()


@pytest.mark.parametrize("cuts", [[500], [1, 499], [100, 150, 250]])
def test_regression_and_multilabel_sums_in_pieces_are_the_whole_report(cuts):
    rng = np.random.default_rng(0)
    truth, guess = rng.standard_normal((500, 2)) * [1, 1e4] + [0, 1e6], rng.standard_normal((500, 2)) * 50 + [0, 1e6]
    tags, picked = rng.random((500, 4)) < 0.4, rng.random((500, 4)) < 0.5
    sums, tag_sums = metrics.RegressionSums(), metrics.MultiLabelSums(list("abcd"))
    for lo, hi in zip(np.cumsum([0] + cuts[:-1]), np.cumsum(cuts)):
        sums.add(truth[lo:hi], guess[lo:hi])
        tag_sums.add(tags[lo:hi], picked[lo:hi])
    err = guess - truth
    r2 = 1 - (err ** 2).sum(axis=0) / ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)  # by hand, not by the sums
    report = sums.report()
    assert report["mse"] == pytest.approx((err ** 2).mean(), rel=1e-12)
    assert report["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-12)
    np.testing.assert_allclose(report["r2_per_output"], r2, rtol=1e-9)
    assert tag_sums.report() == metrics.multilabel_report(tags, picked, list("abcd"))
    assert tag_sums.report()["subset_accuracy"] == pytest.approx((tags == picked).all(axis=1).mean())


def test_report_sums_follow_the_task():
    assert isinstance(metrics.report_sums(target_task("regression"), []), metrics.RegressionSums)
    assert isinstance(metrics.report_sums(target_task("multilabel"), ["a"]), metrics.MultiLabelSums)
    assert isinstance(metrics.report_sums(target_task("binary"), ["a", "b"]), metrics.ClassSums)
