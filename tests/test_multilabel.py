"""Multi-label classification: binary_cross_entropy on a column of `|`-separated labels trains one
sigmoid output per label; its scores agree with hand counts, `predict` writes the set and one 0/1
column per label (and probabilities), `evaluate` and an exported ONNX model agree with it, and 2 ranks
give one process's weights."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from conftest import ROOT, assert_same_weights, find_mpiexec, run_cli, saved_weights, train_on, write_csv
from magmadnn_cli.data.metrics import multilabel_report
from magmadnn_cli.data.targets import target_task, table_task

LABELS = ("north", "east", "far")


def _tags_csv(path, n: int = 240, seed: int = 0) -> None:
    """Points in the plane tagged with every label that fits: north (y > 0), east (x > 0), far (|p| > 1.2)."""
    r = np.random.default_rng(seed)
    rows = []
    for x, y in r.normal(size=(n, 2)):
        tags = [name for name, on in zip(LABELS, (y > 0, x > 0, np.hypot(x, y) > 1.2)) if on]
        rows.append([round(float(x), 4), round(float(y), 4), " | ".join(tags) or "|"])  # "|": no label
    write_csv(path, ["x", "y", "tags"], rows)


CONFIG = """\
name: tags
seed: 0
device: cpu
data: {train: tags.csv, target: tags, validation_split: 0.2, test_split: 0.2, normalize: standard}
model:
  layers:
    - {type: dense, units: 32, activation: tanh}
    - {type: dense, units: 3, activation: sigmoid}
loss: binary_cross_entropy
optimizer: {type: adam, learning_rate: 0.02}
training: {epochs: 40, batch_size: 16}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tags")
    _tags_csv(folder / "tags.csv")
    (folder / "c.yaml").write_text(CONFIG)
    return train_on(folder / "run", [], config=folder / "c.yaml"), folder


def test_scores_agree_with_hand_counts():
    truth = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]])
    guess = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 1], [0, 0, 1]])
    report = multilabel_report(truth, guess, ["a", "b", "c"])
    # cells right: 9 of 12; rows all right: 2 of 4; pooled tp 4, predicted 5, actual 6
    assert report["accuracy"] == pytest.approx(9 / 12) and report["hamming_loss"] == pytest.approx(3 / 12)
    assert report["subset_accuracy"] == pytest.approx(0.5)
    assert report["micro_precision"] == pytest.approx(4 / 5) and report["micro_recall"] == pytest.approx(4 / 6)
    assert report["micro_f1"] == pytest.approx(2 * 4 / (5 + 6))
    f1 = [2 * 2 / (2 + 2), 2 * 1 / (1 + 2), 2 * 1 / (2 + 2)]  # per label: 2 tp / (predicted + actual)
    assert report["macro_f1"] == pytest.approx(np.mean(f1))
    assert report["per_label"]["b"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}


def test_label_sets_make_a_binary_loss_multilabel_and_encode_one_column_per_label():
    cells = np.array(["a|b", " c ", "b|a|a", "c|"], dtype=object)
    assert table_task("binary", cells) == "multilabel" and table_task("binary", np.array(["a", "b"])) == "binary"
    assert table_task("classification", cells) == "classification"
    task = target_task("multilabel")
    labels = task.labels(cells, "t.csv")
    assert labels == ["a", "b", "c"]
    np.testing.assert_array_equal(task.encode(cells, labels, "t.csv"), [[1, 1, 0], [0, 0, 1], [1, 1, 0], [0, 0, 1]])


def test_training_reports_per_label_and_pooled_scores(trained):
    run, _ = trained
    metrics = json.loads((run / "metrics.json").read_text())
    test = metrics["test"]
    assert set(test["per_label"]) == {"east", "far", "north"}
    assert test["accuracy"] > 0.9 and test["micro_f1"] > 0.85, test   # the rule is learnable
    assert 0 <= test["subset_accuracy"] <= test["accuracy"]


def test_predict_writes_the_set_and_a_column_per_label_as_evaluate_scores_them(trained, capsys):
    run, folder = trained
    code, out, err = run_cli(capsys, "predict", run / "model.npz", folder / "tags.csv", "--proba")
    assert code == 0, err
    rows = list(csv.reader(out.splitlines()))
    header, body = rows[0], rows[1:]
    assert header == ["prediction", "east", "far", "north", "prob_east", "prob_far", "prob_north"]
    probs = np.array([[float(v) for v in r[4:]] for r in body])
    chosen = np.array([[int(v) for v in r[1:4]] for r in body])
    np.testing.assert_array_equal(chosen, probs > 0.5)
    joined = ["|".join(h for h, c in zip(header[1:4], r) if c) for r in chosen]
    assert [r[0] for r in body] == joined
    truth = [set(t.strip() for t in r[2].split("|")) for r in list(csv.reader(open(folder / "tags.csv")))[1:]]
    want = np.array([[name in t for name in header[1:4]] for t in truth])
    code, out, err = run_cli(capsys, "evaluate", run / "model.npz", folder / "tags.csv", "--json")
    assert code == 0, err
    scored = json.loads(out)
    assert scored["accuracy"] == pytest.approx((chosen == want).mean())
    assert scored["subset_accuracy"] == pytest.approx((chosen == want).all(axis=1).mean())


def test_the_exported_model_gives_predicts_probabilities_and_labels(trained, capsys, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    run, folder = trained
    assert run_cli(capsys, "export", run / "model.npz", "-o", tmp_path / "m.onnx")[0] == 0
    code, out, _ = run_cli(capsys, "predict", run / "model.npz", folder / "tags.csv", "--proba")
    body = list(csv.reader(out.splitlines()))[1:]
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    points = np.array([r[:2] for r in list(csv.reader(open(folder / "tags.csv")))[1:]], np.float32)
    probs, labels = session.run(["probabilities", "labels"], {session.get_inputs()[0].name: points})
    np.testing.assert_allclose(probs, np.array([[float(v) for v in r[4:]] for r in body]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(labels, np.array([[int(v) for v in r[1:4]] for r in body]))


def test_class_weight_is_refused_for_label_sets(tmp_path, capsys):
    _tags_csv(tmp_path / "tags.csv", n=60)
    (tmp_path / "c.yaml").write_text(CONFIG.replace("training: {", "training: {class_weight: balanced, "))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 2 and "class_weight" in err and "several labels a row" in err and "Traceback" not in err


def test_more_than_two_plain_labels_under_binary_name_the_separator(tmp_path, capsys):
    write_csv(tmp_path / "t.csv", ["x", "label"], [[i, "abc"[i % 3]] for i in range(30)])
    (tmp_path / "c.yaml").write_text(CONFIG.replace("tags.csv, target: tags", "t.csv, target: label"))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 2 and "'|'" in err and "multi-label" in err


def test_summary_checks_the_output_against_the_labels_not_two_classes(capsys):
    code, out, err = run_cli(capsys, "summary", ROOT / "configs" / "digits_multilabel.yaml")
    assert code == 0 and "expected" not in err, err
    code, _, err = run_cli(capsys, "summary", ROOT / "configs" / "digits_multilabel.yaml", "--set",
                           "model.layers.2.units=4")
    assert code == 2 and "expected 5" in err and "one sigmoid unit per label" in err and "multi-label" in err


def test_the_shipped_multilabel_config_learns_the_digits_properties(tmp_path):
    run = train_on(tmp_path / "run", ["training.epochs=8"], config=ROOT / "configs" / "digits_multilabel.yaml")
    test = json.loads((run / "metrics.json").read_text())
    test = test["test"]
    assert test["labels"] == ["big", "even", "odd", "prime", "square"]
    assert test["accuracy"] > 0.95 and test["macro_f1"] > 0.93, test


@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec")
def test_two_ranks_give_one_process_weights(tmp_path):
    _tags_csv(tmp_path / "tags.csv")
    (tmp_path / "c.yaml").write_text(CONFIG.replace("epochs: 40", "epochs: 3").replace("seed: 0", "seed: 0\nprecision: float64"))
    one = train_on(tmp_path / "one", [], config=tmp_path / "c.yaml")
    two = train_on(tmp_path / "two", [], ranks=2, config=tmp_path / "c.yaml")
    assert saved_weights(one)
    assert_same_weights(two, one, 1e-12)
