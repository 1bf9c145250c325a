"""Loaders on files the tests write: CSV (plain and gzip), NPZ, synthetic; splits, labels,
normalization from training rows only; malformed input gives a located DataError."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from magmadnn_cli.config.schema import DataConfig, SyntheticData
from magmadnn_cli.data.prepare import Normalizer, prepare, sample_shape_of
from magmadnn_cli.data.readers import ReadSpec, read_table, synthetic
from magmadnn_cli.errors import DataError

from conftest import ROOT, run_cli, write_csv


def test_csv_with_string_labels_and_feature_subset(tmp_path):
    write_csv(tmp_path / "d.csv", ["a", "b", "c", "y"], [[1, 2, 3, "cat"], [4, 5, 6, "dog"], [7, 8, 9, "cat"]])
    t = read_table(tmp_path / "d.csv", ReadSpec("y", ["c", "a"]))
    np.testing.assert_array_equal(t.x, [[3, 1], [6, 4], [9, 7]])
    assert t.x.dtype == np.float32 and t.features == ["c", "a"]
    assert list(t.y) == ["cat", "dog", "cat"]


def test_gzip_csv_and_int_labels(tmp_path):
    with gzip.open(tmp_path / "d.csv.gz", "wt") as f:
        f.write("y,x1,x2\n3,0.5,1\n7,1.5,2\n")
    t = read_table(tmp_path / "d.csv.gz", ReadSpec("y", None))
    assert t.y.dtype.kind == "i" and list(t.y) == [3, 7]
    np.testing.assert_allclose(t.x, [[0.5, 1], [1.5, 2]])


@pytest.mark.parametrize("text,message", [
    ("", "empty file"),
    ("a,b,y\n", "header but no data rows"),
    ("a,b,y\n1,2,0\n3,4\n", "d.csv:3: the row has 2 fields; the header has 3"),
    ("a,b,y\n1,inf,0\n3,4,1\n", "column 'b', data row 1: non-finite value inf"),
    ("a,a,y\n1,2,0\n", "duplicate column names in the header: 'a'"),
    ("a,b,label\n1,2,0\n", "no target column 'y' (data.target); columns are a, b, label"),
    ("a,b,Y\n1,2,0\n", "no target column 'y' (data.target); columns are a, b, Y; did you mean 'Y'?"),
])
def test_malformed_csv_is_a_located_error(tmp_path, text, message):
    (tmp_path / "d.csv").write_text(text)
    with pytest.raises(DataError) as info:
        read_table(tmp_path / "d.csv", ReadSpec("y", None))
    assert message in str(info.value)


def test_npz_and_its_problems(tmp_path):
    np.savez(tmp_path / "ok.npz", x=np.arange(12).reshape(4, 3), y=np.array([0, 1, 0, 1]))
    t = read_table(tmp_path / "ok.npz", ReadSpec(None, None))
    assert t.x.shape == (4, 3) and t.x.dtype == np.float32 and not t.notes
    named = read_table(tmp_path / "ok.npz", ReadSpec("species", ["a", "b"]))  # column settings for a table: said unused
    assert named.notes == [f"{tmp_path / 'ok.npz'}: data.target (species) and data.features (['a', 'b']) ignored: an "
                           ".npz has no columns to name; its arrays x (the samples) and y (the targets) are read"]
    np.savez(tmp_path / "nox.npz", z=np.zeros(3))
    with pytest.raises(DataError, match="expected arrays 'x' and 'y'"):
        read_table(tmp_path / "nox.npz", ReadSpec(None, None))
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object), y=np.zeros(1))
    with pytest.raises(DataError, match="never loaded"):
        read_table(tmp_path / "obj.npz", ReadSpec(None, None))
    (tmp_path / "junk.npz").write_bytes(b"\x80\x04junk")
    with pytest.raises(DataError, match="not an .npz archive"):
        read_table(tmp_path / "junk.npz", ReadSpec(None, None))
    (tmp_path / "ok.parquet").write_bytes(b"PAR1")
    with pytest.raises(DataError, match="cannot read it as parquet"):
        read_table(tmp_path / "ok.parquet", ReadSpec(None, None))
    (tmp_path / "sheet.sav").write_bytes(b"PK\x03\x04")
    with pytest.raises(DataError, match="unknown data format; expected .csv.*.parquet.*.jsonl"):
        read_table(tmp_path / "sheet.sav", ReadSpec(None, None))


def test_synthetic_teacher_data_is_seeded_and_learnable_shape():
    spec = SyntheticData(samples=500, features=7, classes=4)
    a, b = synthetic(spec, 3), synthetic(spec, 3)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    assert a.x.shape == (500, 7) and set(np.unique(a.y)) == {0, 1, 2, 3}


def test_prepare_splits_encodes_and_normalizes_from_train_only(tmp_path):
    rows = [[i, 100 + 2 * i, ["lo", "hi"][i % 2]] for i in range(100)]
    write_csv(tmp_path / "d.csv", ["a", "b", "y"], rows)
    cfg = DataConfig(train=tmp_path / "d.csv", target="y", validation_split=0.2, test_split=0.1, normalize="standard")
    p = prepare(cfg, "classification", seed=4)
    assert (len(p.train.x), len(p.validation.x), len(p.test.x)) == (70, 20, 10)
    assert p.classes == ["hi", "lo"]
    np.testing.assert_allclose(p.train.x.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(p.train.x.std(axis=0), 1, atol=1e-4)
    assert abs(p.validation.x.mean()) > 1e-4  # validation rows use the training statistics
    again = prepare(cfg, "classification", seed=4)
    np.testing.assert_array_equal(again.test.x, p.test.x)
    assert not np.array_equal(prepare(cfg, "classification", seed=5).test.x, p.test.x)


def test_binary_and_regression_targets(tmp_path):
    write_csv(tmp_path / "d.csv", ["a", "y"], [[i, i % 2] for i in range(10)])
    p = prepare(DataConfig(train=tmp_path / "d.csv", target="y", validation_split=0), "binary", 0)
    assert p.train.y.shape == (10, 1) and p.train.y.dtype == np.float32
    p = prepare(DataConfig(train=tmp_path / "d.csv", target="a", validation_split=0), "regression", 0)
    assert p.train.y.shape == (10, 1) and p.classes == []


def test_label_problems(tmp_path):
    write_csv(tmp_path / "one.csv", ["a", "y"], [[1, "x"], [2, "x"]])
    with pytest.raises(DataError, match="single class"):
        prepare(DataConfig(train=tmp_path / "one.csv", target="y", validation_split=0), "classification", 0)
    write_csv(tmp_path / "tr.csv", ["a", "y"], [[1, "x"], [2, "z"]])
    write_csv(tmp_path / "va.csv", ["a", "y"], [[1, "x"], [2, "w"]])
    cfg = DataConfig(train=tmp_path / "tr.csv", target="y", validation=tmp_path / "va.csv")
    with pytest.raises(DataError, match="labels 'w' do not occur in the training data \\(known: '"):
        prepare(cfg, "classification", 0)


CASED = """\
name: cased
data: {{train: d.csv, target: y, validation_split: 0{extra}}}
model: {{layers: [{{type: dense, units: {units}, activation: softmax}}]}}
loss: cross_entropy
optimizer: {{type: adam}}
training: {{epochs: 1}}
"""


def test_labels_that_differ_only_in_case_are_named_with_the_label_map_that_merges_them(capsys, tmp_path):
    labels = ["yes", "no", "Yes", "no ", "NO", "no"]
    write_csv(tmp_path / "d.csv", ["a", "y"], [[i, labels[i % 6]] for i in range(30)])
    (tmp_path / "c.yaml").write_text(CASED.format(units=2, extra=""))
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "r")
    said = " ".join(err.split())
    assert code == 2 and "expected 4" in said and "differ only in case: 'NO', 'no'; 'Yes', 'yes'" in said, said
    assert 'data.label_map: {"NO": "no", "Yes": "yes"}' in said, said
    (tmp_path / "c.yaml").write_text(CASED.format(units=4, extra=""))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "r")
    assert code == 0 and "differ only in case" in " ".join((out + err).split())
    (tmp_path / "c.yaml").write_text(CASED.format(units=2, extra=', label_map: {"NO": "no", "Yes": "yes"}'))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "merged")
    assert code == 0 and "differ only in case" not in out + err, err
    write_csv(tmp_path / "b.csv", ["a", "y"], [[i, ["yes", "no", "Yes"][i % 3]] for i in range(30)])
    with pytest.raises(DataError, match=r"the target has 3 \('Yes', 'no', 'yes'\); labels that differ only in case: 'Yes', 'yes' .*"
                                        r'data.label_map: \{"Yes": "yes"\}'):
        prepare(DataConfig(train=tmp_path / "b.csv", target="y"), "binary", 0)


def test_minmax_normalizer_and_scale():
    x = np.array([[0.0, 5.0], [10.0, 5.0]], np.float32)
    n = Normalizer.fit(x, "minmax", scale=0.5)
    np.testing.assert_allclose(n(x), [[0, 0], [1, 0]])


def test_shipped_datasets_have_their_documented_shapes():
    # digits: 64 pixel columns, 3 of them 0 in every training row (pixel0, pixel32, pixel39) and left out
    for name, target, width in [("digits.csv.gz", "label", 61), ("iris.csv", "species", 4),
                                ("heart_cleveland.csv", "disease", 13), ("breast_cancer.csv", "diagnosis", 30),
                                ("diabetes.csv", "progression", 10)]:
        cfg = DataConfig(train=ROOT / "datasets" / name, target=target)
        assert sample_shape_of(cfg, "regression" if target == "progression" else "classification", 0) == (width,)
    heart = read_table(ROOT / "datasets" / "heart_cleveland.csv", ReadSpec("disease", None))
    assert heart.x.shape == (303, 13) and sorted(np.unique(heart.y)) == [0, 1]


def test_data_from_a_fifo_or_stdin_is_read_once(tmp_path):
    """A pipe can be read only once: train from a FIFO and from stdin (`data.train: -`), predict rows
    from stdin; the same results as from the file."""
    import os
    import subprocess
    import sys
    import threading

    from conftest import BLOBS_CONFIG, blobs_csv
    blobs_csv(tmp_path / "blobs.csv")
    data = (tmp_path / "blobs.csv").read_bytes()
    fifo = tmp_path / "blobs.fifo"
    os.mkfifo(fifo)
    (tmp_path / "fifo.yaml").write_text(BLOBS_CONFIG.replace("blobs.csv", "blobs.fifo"))
    (tmp_path / "file.yaml").write_text(BLOBS_CONFIG)

    def run(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "magmadnn_cli", *map(str, args)], input=stdin,
                              capture_output=True, timeout=120)
    writer = threading.Thread(target=lambda: fifo.write_bytes(data))
    writer.start()
    from_fifo = run("train", tmp_path / "fifo.yaml", "--out", tmp_path / "fifo", "-q")
    writer.join(timeout=10)
    assert from_fifo.returncode == 0, from_fifo.stderr.decode()
    from_stdin = run("train", tmp_path / "file.yaml", "--out", tmp_path / "stdin", "-q", "--set", "data.train=-",
                     stdin=data)
    assert from_stdin.returncode == 0, from_stdin.stderr.decode()
    from_file = run("train", tmp_path / "file.yaml", "--out", tmp_path / "file", "-q")
    assert from_file.returncode == 0, from_file.stderr.decode()
    with np.load(tmp_path / "file" / "model.npz") as a, np.load(tmp_path / "fifo" / "model.npz") as b, \
            np.load(tmp_path / "stdin" / "model.npz") as c:
        for key in (k for k in a.files if k.startswith("weights/")):
            assert np.array_equal(a[key], b[key]) and np.array_equal(a[key], c[key]), key
    predicted = run("predict", tmp_path / "file" / "model.npz", "-", stdin=data)
    assert predicted.returncode == 0, predicted.stderr.decode()
    assert predicted.stdout == run("predict", tmp_path / "file" / "model.npz", tmp_path / "blobs.csv").stdout
    import gzip
    packed = run("train", tmp_path / "file.yaml", "--out", tmp_path / "gz", "-q", "--set", "data.train=-",
                 stdin=gzip.compress(data))  # it was sent to data.encoding, which predict cannot even set
    said = " ".join(packed.stderr.decode().split())
    assert packed.returncode == 2 and "stdin: not CSV text: it is gzip-compressed; a pipe takes CSV text" in said, said
    # several ranks would each read it: refused at once, before any rank starts (it hung: rank 1 read an empty stdin)
    for command in ("train", "tune"):
        ranked = run(command, tmp_path / "file.yaml", "--out", tmp_path / f"ranked-{command}", "--processes", "2",
                     "--set", "data.train=-", stdin=data)
        said = " ".join(ranked.stderr.decode().split())
        assert ranked.returncode == 2 and "data.train: stdin can be read once, by one process, and this command " \
            "runs 2 ranks" in said and not (tmp_path / f"ranked-{command}").exists(), said
