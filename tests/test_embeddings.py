"""Category embeddings (`data.columns.X: {type: category, embedding: d}`): the column is encoded as its
code and the network's first stage looks up a learned d-wide vector. The op equals a one-hot block times
the table and its gradients equal finite differences; a 10,000-category column keeps the first layer
small; predict, export (onnxruntime) and summary read the model file; 2 ranks give one process's weights."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from conftest import assert_same_weights, check_op_grads, find_mpiexec, run_cli, saved_weights, train_on, write_csv
from magmadnn_cli.core.graph import Graph, Variable
from magmadnn_cli.core.graph.embed import Embed


def _table(path, n: int = 1200, categories: int = 40, seed: int = 0) -> None:
    """A city's hidden effect plus a number decide the label: learnable only through the city."""
    r = np.random.default_rng(seed)
    city, effect, x = r.integers(0, categories, n), r.normal(size=categories), r.normal(size=n)
    label = np.where(effect[city] + 0.5 * x > 0, "yes", "no")
    write_csv(path, ["city", "x", "label"], [[f"c{c}", round(float(v), 4), y] for c, v, y in zip(city, x, label)])


CONFIG = """\
name: emb
seed: 0
device: cpu
data: {train: t.csv, target: label, validation_split: 0.2, test_split: 0.2,
       columns: {city: {type: category, embedding: 4}}}
model:
  layers:
    - {type: dense, units: 16, activation: relu}
    - {type: dense, units: 1, activation: sigmoid}
loss: binary_cross_entropy
optimizer: {type: adam, learning_rate: 0.01}
training: {epochs: 15, batch_size: 32}
"""


def test_the_lookup_is_a_one_hot_block_times_the_table_and_unseen_codes_give_zeros():
    x = np.array([[0.5, 2.0, -1.0], [1.5, 0.0, 3.0], [2.5, -1.0, 1.0]])  # code columns 1 (3 values) and 2 (4)
    t1, t2 = np.arange(6.0).reshape(3, 2), np.arange(12.0).reshape(4, 3) / 10
    node = Embed(Variable("x", x), [Variable("t1", t1), Variable("t2", t2)], [1, 2], [0])
    Graph(node).forward()
    hot1 = np.array([[0, 0, 1], [1, 0, 0], [0, 0, 0]])  # code -1: no category
    hot2 = np.array([[0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]])
    np.testing.assert_allclose(node.value, np.concatenate([x[:, :1], hot1 @ t1, hot2 @ t2], axis=1))


def test_the_tables_gradients_equal_finite_differences():
    codes = np.array([[0.0, 1.0], [2.0, -1.0], [0.0, 1.0], [1.0, 0.0]])  # repeats add up; -1 gets none
    check_op_grads(lambda t1, t2: Embed(Variable("x", np.concatenate([codes, np.ones((4, 1))], axis=1)),
                                        [t1, t2], [0, 1], [2]),
                   np.random.default_rng(1).normal(size=(3, 2)), np.random.default_rng(2).normal(size=(2, 3)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("emb")
    _table(folder / "t.csv")
    (folder / "c.yaml").write_text(CONFIG)
    return train_on(folder / "run", [], config=folder / "c.yaml"), folder


def test_an_embedded_column_learns_and_is_saved_as_a_table(trained):
    run, _ = trained
    weights = saved_weights(run)
    assert weights["weights/embeddings/city"].shape == (40, 4)
    assert weights["weights/dense_0/kernel"].shape == (1 + 4, 16)  # x and the city's 4 values
    assert json.loads((run / "metrics.json").read_text())["test"]["accuracy"] > 0.8


def test_predict_export_and_summary_read_the_model_file(trained, capsys, tmp_path):
    run, folder = trained
    rows = list(csv.reader(open(folder / "t.csv")))[1:21] + [["c_never_seen", "0.3", "yes"]]
    write_csv(tmp_path / "p.csv", ["city", "x", "label"], rows)
    code, out, err = run_cli(capsys, "predict", run / "model.npz", tmp_path / "p.csv", "--proba")
    assert code == 0 and "c_never_seen" in err  # said as unseen, encoded as zeros
    probs = np.array([[float(v) for v in r[1:]] for r in list(csv.reader(out.splitlines()))[1:]])
    code, out, _ = run_cli(capsys, "summary", run)
    assert code == 0 and "column_embeddings" in out and "embedded in 4" in out
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    assert run_cli(capsys, "export", run / "model.npz", "-o", tmp_path / "m.onnx")[0] == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    feeds = {"city": np.array([[r[0]] for r in rows], dtype=object),
             "x": np.array([[float(r[1])] for r in rows], np.float32)}
    np.testing.assert_allclose(session.run(["probabilities"], feeds)[0], probs, rtol=1e-5, atol=1e-6)


def test_ten_thousand_categories_keep_the_first_layer_small(tmp_path):
    _table(tmp_path / "t.csv", n=20000, categories=10000)
    (tmp_path / "c.yaml").write_text(CONFIG.replace("embedding: 4", "embedding: 8").replace("epochs: 15", "epochs: 1"))
    run = train_on(tmp_path / "run", [], config=tmp_path / "c.yaml")
    weights = saved_weights(run)
    assert weights["weights/dense_0/kernel"].shape == (1 + 8, 16)  # one-hot: (10,001, 16)
    assert sum(w.size for w in weights.values()) < 10000 * 8 + 400


def test_embedding_on_a_number_column_is_refused_at_its_key(tmp_path, capsys):
    _table(tmp_path / "t.csv", n=60)
    (tmp_path / "c.yaml").write_text(CONFIG.replace("city: {type: category, embedding: 4}",
                                                    "x: {type: number, embedding: 4}"))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 2 and "data.columns.x" in err and "embedding is for category columns" in err


@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec")
def test_two_ranks_give_one_process_weights(tmp_path):
    _table(tmp_path / "t.csv", n=400)
    (tmp_path / "c.yaml").write_text(CONFIG.replace("epochs: 15", "epochs: 2").replace("seed: 0", "seed: 0\nprecision: float64"))
    one = train_on(tmp_path / "one", [], config=tmp_path / "c.yaml")
    two = train_on(tmp_path / "two", [], ranks=2, config=tmp_path / "c.yaml")
    assert_same_weights(two, one, 1e-12)
