"""Parquet, Feather / Arrow IPC and JSON Lines (issue 28): the same table in any format trains to the
metrics of its CSV, typed columns keep their types, predict streams record batches and writes the
format its output's suffix names. The files are written by pyarrow (and pandas when installed)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli

pa = pytest.importorskip("pyarrow")
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq

DATA = Path(__file__).parent.parent / "datasets" / "processed.cleveland.data"
NAMES = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak", "slope", "ca",
         "thal", "num"]
PAIN = {1: "typical", 2: "atypical", 3: "non-anginal", 4: "asymptomatic"}

CONFIG = """\
name: heart
seed: 0
device: cpu
data:
  train: {train}
  target: num
  label_map: {{0: absent, 1: present, 2: present, 3: present, 4: present}}
  columns: {{restecg: category, slope: category}}
  validation_split: 0.15
  test_split: 0.15
model:
  layers:
    - {{type: dense, units: 8, activation: relu}}
    - {{type: dense, units: 1, activation: sigmoid}}
loss: binary_cross_entropy
optimizer: {{type: adam, learning_rate: 0.01}}
training: {{epochs: 15, batch_size: 16, checkpoint: false}}
"""


def heart_table() -> "pa.Table":
    """The raw UCI Cleveland file as typed columns: ints, floats with nulls (its `?` cells), a
    boolean, text categories (one dictionary-encoded, with nulls), an int target."""
    rows = [line.split(",") for line in DATA.read_text().split()]
    cells = {n: [None if r[i] == "?" else float(r[i]) for r in rows] for i, n in enumerate(NAMES)}
    ints = lambda n: pa.array([int(v) for v in cells[n]], pa.int64())  # noqa: E731
    return pa.table({
        "age": ints("age"), "sex": pa.array([v == 1 for v in cells["sex"]]),
        "cp": pa.array([PAIN[int(v)] for v in cells["cp"]]),
        "trestbps": pa.array([int(v) for v in cells["trestbps"]], pa.int32()),
        "chol": pa.array(cells["chol"], pa.float32()), "fbs": ints("fbs"), "restecg": ints("restecg"),
        "thalach": ints("thalach"), "exang": ints("exang"), "oldpeak": pa.array(cells["oldpeak"], pa.float64()),
        "slope": ints("slope"), "ca": pa.array(cells["ca"], pa.float64()),
        "thal": pa.array([None if v is None else {3: "normal", 6: "fixed", 7: "reversible"}[int(v)]
                          for v in cells["thal"]]).dictionary_encode(),
        "num": ints("num")})


def write_jsonl(table: "pa.Table", path: Path) -> None:
    text = "".join(json.dumps(row) + "\n" for row in table.to_pylist())
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def write_arrow_stream(table: "pa.Table", path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=100)


WRITE = {
    "csv": lambda t, p: pacsv.write_csv(t, str(p)),
    "parquet": lambda t, p: pq.write_table(t, str(p), row_group_size=64),
    "pq": lambda t, p: pq.write_table(t, str(p), compression="zstd"),
    "feather": lambda t, p: feather.write_feather(t, str(p), chunksize=50),
    "arrow": write_arrow_stream,
    "jsonl": write_jsonl,
    "ndjson.gz": write_jsonl,
}


def _train(capsys, folder: Path, suffix: str) -> dict:
    path = folder / f"heart.{suffix}"
    WRITE[suffix](heart_table(), path)
    (folder / f"{suffix}.yaml").write_text(CONFIG.format(train=path.name))
    code, _, err = run_cli(capsys, "train", str(folder / f"{suffix}.yaml"), "--out", str(folder / suffix), "-q")
    assert code == 0, err
    return json.loads((folder / suffix / "metrics.json").read_text())


@pytest.fixture(scope="module")
def csv_metrics(tmp_path_factory):
    folder = tmp_path_factory.mktemp("csv")
    WRITE["csv"](heart_table(), folder / "heart.csv")
    (folder / "c.yaml").write_text(CONFIG.format(train="heart.csv"))
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", "c.yaml", "--out", "run", "-q"],
                          cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads((folder / "run" / "metrics.json").read_text())


@pytest.mark.parametrize("suffix", ["parquet", "pq", "feather", "arrow", "jsonl", "ndjson.gz"])
def test_the_same_table_in_every_format_trains_to_the_csv_metrics(suffix, csv_metrics, capsys, tmp_path):
    metrics = _train(capsys, tmp_path, suffix)
    for split in ("train", "validation", "test"):
        for key in ("loss", "accuracy"):
            assert metrics[split][key] == pytest.approx(csv_metrics[split][key], rel=1e-6), (split, key)
    assert metrics["parameters"] == csv_metrics["parameters"]  # the same one-hot widths: the same inferred types


def test_a_file_written_by_pandas_trains_like_its_csv(csv_metrics, capsys, tmp_path):
    pd = pytest.importorskip("pandas")
    frame = heart_table().to_pandas()
    frame.to_parquet(tmp_path / "heart.parquet")
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="heart.parquet"))
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"), "-q")
    assert code == 0, err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test"]["loss"] == pytest.approx(csv_metrics["test"]["loss"], rel=1e-6), pd.__version__


def _read_back(path: Path) -> "pa.Table":
    name = path.name
    if name.endswith(".parquet"):
        return pq.read_table(path)
    if name.endswith(".feather"):
        return feather.read_table(path)
    if ".jsonl" in name:
        import pyarrow.json as pajson
        return pajson.read_json(pa.BufferReader(gzip.decompress(path.read_bytes()) if name.endswith(".gz")
                                                else path.read_bytes()))
    return pacsv.read_csv(path)


@pytest.mark.parametrize("output", ["p.parquet", "p.feather", "p.jsonl", "p.jsonl.gz", "p.csv.gz"])
def test_predict_reads_any_format_and_writes_the_one_its_output_names(output, capsys, tmp_path):
    _train(capsys, tmp_path, "parquet")
    model, data = tmp_path / "parquet" / "model.npz", tmp_path / "heart.parquet"
    assert run_cli(capsys, "predict", str(model), str(data), "--proba", "-k", "age", "-o", str(tmp_path / "p.csv"))[0] == 0
    code, _, err = run_cli(capsys, "predict", str(model), str(data), "--proba", "-k", "age", "-o", str(tmp_path / output))
    assert code == 0, err
    expected, got = pacsv.read_csv(tmp_path / "p.csv"), _read_back(tmp_path / output)
    assert got.column_names == ["age", "prediction", "prob_absent", "prob_present"]
    assert got.num_rows == 303 == expected.num_rows
    assert got.column("prediction").to_pylist() == expected.column("prediction").to_pylist()
    np.testing.assert_array_equal(got.column("prob_present").to_numpy(), expected.column("prob_present").to_numpy())
    if output.endswith((".parquet", ".feather")):  # typed: probabilities are numbers, kept cells text
        assert got.schema.field("prob_present").type == pa.float64()
        assert got.schema.field("age").type == pa.string()
        assert got.schema.field("prediction").type == pa.string()


def test_predictions_of_int_labels_are_ints_in_a_typed_output(capsys, tmp_path):
    table = heart_table()
    table = table.set_column(table.column_names.index("num"), "num",
                             pa.array([min(v, 1) for v in table.column("num").to_pylist()]))
    pq.write_table(table, tmp_path / "heart.parquet")
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="heart.parquet").replace(
        "  label_map: {0: absent, 1: present, 2: present, 3: present, 4: present}\n", ""))
    assert run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"), "-q")[0] == 0
    code, _, err = run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "heart.parquet"),
                           "-o", str(tmp_path / "p.parquet"))
    assert code == 0, err
    predicted = pq.read_table(tmp_path / "p.parquet").column("prediction")
    assert predicted.type == pa.int64() and set(predicted.to_pylist()) <= {0, 1}


def _arrow_peak(path: Path, rows: int, chunk_rows: int = 32_768) -> int:
    """The most bytes Arrow holds at once while `path` (of `rows` rows, 8 float64 columns) is read in chunks."""
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data.columnar import columnar_chunks
    from magmadnn_cli.data.readers import ReadSpec
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({f"f{i}": rng.normal(size=rows) for i in range(8)}), path, row_group_size=chunk_rows)
    spec = ReadSpec(None, None, False, DataConfig(train=path.name), np.float32)
    base, peak, seen = pa.total_allocated_bytes(), 0, 0
    for table in columnar_chunks(path, spec, chunk_rows):
        assert len(table.x) <= chunk_rows
        seen += len(table.x)
        peak = max(peak, pa.total_allocated_bytes() - base)
    assert seen == rows
    return peak


def test_predict_streams_record_batches_in_bounded_memory(tmp_path):
    """Read 32,768 rows at a time, a file four times as long takes no more memory: 600,000 rows
    (38 MB of float64 once decoded) are read holding a few MB."""
    small, large = _arrow_peak(tmp_path / "small.parquet", 150_000), _arrow_peak(tmp_path / "large.parquet", 600_000)
    assert large <= small * 1.1, (small, large)
    assert large < 600_000 * 8 * 8 / 4, f"Arrow held {large / 1e6:.1f} MB at once"


# -- JSON Lines as people write them -------------------------------------------------------------
def _jsonl_project(folder: Path, records: list[dict], name: str = "d.jsonl") -> Path:
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "c.yaml").write_text(CONFIG.format(train=name).replace("target: num", "target: y").replace(
        "  label_map: {0: absent, 1: present, 2: present, 3: present, 4: present}\n", "").replace(
        "  columns: {restecg: category, slope: category}\n", "").replace("test_split: 0.15", "test_split: 0.0"))
    return folder / "c.yaml"


def _records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"a": round(float(a), 4), "code": str(int(c)), "y": "yes" if a > 0 else "no"}
            for a, c in zip(rng.normal(size=n), rng.integers(0, 3, size=n))]


def test_json_lines_whose_keys_change_type_or_appear_late_read_like_their_csv(capsys, tmp_path):
    """pyarrow's typed reader refuses both; the line reader takes over from the record it refused,
    and the table is the one the same cells give as CSV."""
    from magmadnn_cli.data.readers import ReadSpec, read_table
    from magmadnn_cli.config.data import DataConfig
    records = _records(30_000)
    for i in range(25_000, 30_000, 7):
        records[i]["code"] = int(records[i]["code"])  # a number where text was
    records[-1]["late"] = 1.5  # a key the first block did not have
    _jsonl_project(tmp_path, records)
    header = ["a", "code", "late", "y"]
    rows = [[r["a"], r["code"], r.get("late", ""), r["y"]] for r in records]
    (tmp_path / "d.csv").write_text("\n".join(",".join(map(str, r)) for r in [header] + rows) + "\n")
    spec = ReadSpec.of(DataConfig(train="d.jsonl", target="y", features=["a", "code"]))
    got, expected = read_table(tmp_path / "d.jsonl", spec), read_table(tmp_path / "d.csv", spec)
    np.testing.assert_array_equal(got.x, expected.x)
    np.testing.assert_array_equal(got.y, expected.y)
    assert sorted(got.raw.text) == sorted(expected.raw.text)


@pytest.mark.parametrize("line, expected", [
    ('{"a": 1, "code": "x", "y": "no"', "d.jsonl:3: not JSON"),
    ('[1, "x", "no"]', "d.jsonl:3: a JSON list, not an object"),
    ('{"a": [1, 2], "code": "x", "y": "no"}', "d.jsonl:3: column 'a' holds a JSON list"),
])
def test_a_bad_json_line_is_named_by_line(line, expected, capsys, tmp_path):
    config = _jsonl_project(tmp_path, _records(40))
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    lines[2] = line
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(capsys, "train", str(config), "--out", str(tmp_path / "run"), "-q")
    assert code == 2 and expected in err and "Traceback" not in err, err


# -- mistakes ------------------------------------------------------------------------------------
def test_columnar_mistakes_get_the_csv_messages(capsys, tmp_path):
    pq.write_table(heart_table(), tmp_path / "heart.parquet")
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="heart.parquet").replace("target: num", "target: Num"))
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 2 and "no target column 'Num' (data.target); columns are " in err and "; did you mean 'num'?" in err, err


def test_a_nested_column_is_refused_by_name_unless_left_out(capsys, tmp_path):
    table = heart_table().append_column("readings", pa.array([[1.0, 2.0]] * 303))
    pq.write_table(table, tmp_path / "heart.parquet")
    config = CONFIG.format(train="heart.parquet")
    (tmp_path / "c.yaml").write_text(config)
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"), "-q")
    assert code == 2 and "column 'readings' holds list<" in err and "ignore" in err, err
    (tmp_path / "c.yaml").write_text(config.replace("slope: category}", "slope: category, readings: ignore}"))
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"), "-q")
    assert code == 0, err


@pytest.mark.parametrize("name", ["junk.parquet", "junk.feather", "junk.jsonl.gz"])
def test_a_file_that_is_not_its_suffix_s_format_is_named(name, capsys, tmp_path):
    (tmp_path / name).write_bytes(b"age,num\n1,0\n" * 10)
    (tmp_path / "c.yaml").write_text(CONFIG.format(train=name))
    code, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 2 and name in err and "Traceback" not in err and "internal error" not in err, err
