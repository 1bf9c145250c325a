"""`data.stream: true` end to end (issue 48, item 2): `magmadnn train` on a CSV and a Parquet file read
in many small blocks trains to a real accuracy, repeats its weights, writes a model predict reads,
and refuses, naming data.stream, what streamed runs do not support yet."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import run_cli
from magmadnn_cli.data import stream
from magmadnn_cli.training.batches import rebatched

ROWS = 1200


def _columns(rows: int = ROWS, seed: int = 3) -> dict[str, np.ndarray]:
    """Two numbers and a category that decide the label; 3% missing number cells."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(rows) * 4 + 10, rng.standard_normal(rows)
    kind = np.array(["red", "green", "blue"])[rng.integers(0, 3, rows)]
    score = (a - 10) / 4 + b + np.where(kind == "red", 1.5, np.where(kind == "blue", -1.5, 0.0))
    a[rng.random(rows) < 0.03] = np.nan
    return {"a": a, "b": b, "kind": kind, "label": np.where(score > 0, "yes", "no")}


def _write(tmp_path, kind: str):
    cols = _columns()
    if kind == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps({"a": None if np.isnan(a) else round(float(a), 6), "b": round(float(b), 6),
                                            "kind": str(k), "label": str(y)}) + "\n" for a, b, k, y in zip(*cols.values())))
        return path
    if kind == "parquet":
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table(cols), path, row_group_size=97)
        return path
    path = tmp_path / "t.csv"
    lines = ["a,b,kind,label"] + [f"{'' if np.isnan(a) else f'{a:.6g}'},{b:.6g},{k},{y}"
                                  for a, b, k, y in zip(cols["a"], cols["b"], cols["kind"], cols["label"])]
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(tmp_path, data_path, **data) -> str:
    cfg = {"name": "streamed", "seed": 5,
           "data": {"train": str(data_path), "target": "label", "stream": True, "validation_split": 0.15,
                    "test_split": 0.15, **data},
           "model": {"layers": [{"type": "dense", "units": 16, "activation": "relu"},
                                {"type": "dense", "units": 2, "activation": "softmax"}]},
           "loss": "cross_entropy", "optimizer": {"type": "adam", "learning_rate": 0.01},
           "training": {"epochs": 8, "batch_size": 32}}
    path = tmp_path / f"cfg{len(list(tmp_path.glob('cfg*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(stream, "BLOCK_BYTES", 2000)  # a 40 kB CSV: about 20 blocks
    from magmadnn_cli.data import stream_prepare
    monkeypatch.setattr(stream_prepare, "BUFFER_ROWS", 128)  # rows mixed across several blocks


def _weights(run_dir) -> dict[str, np.ndarray]:
    with np.load(run_dir / "model.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files if k.startswith("param") or "weight" in k or "kernel" in k or "bias" in k}


@pytest.mark.parametrize("kind", ["csv", "parquet", "jsonl"])
def test_streamed_training_learns_repeats_and_predicts(tmp_path, capsys, small_blocks, kind):
    data = _write(tmp_path, kind)
    config = _config(tmp_path, data)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "one")
    assert code == 0, out + err
    assert "streamed in" in out + err and "blocks" in out + err
    metrics = json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.85 and metrics["train"]["accuracy"] >= 0.85
    held = metrics["validation"]["per_class"]
    assert 0.1 * ROWS < sum(c["support"] for c in held.values()) < 0.2 * ROWS  # the hash rule's 15%
    assert run_cli(capsys, "train", config, "--out", tmp_path / "two")[0] == 0
    one, two = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert one and one.keys() == two.keys()
    for name in one:
        np.testing.assert_array_equal(one[name], two[name])
    rows = tmp_path / "new.csv"
    rows.write_text("a,b,kind\n14,1,red\n6,-1,blue\n,0.5,green\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "one" / "model.npz", rows, "-o", tmp_path / "p.csv")
    assert code == 0, out + err
    predicted = (tmp_path / "p.csv").read_text().splitlines()
    assert len(predicted) == 4 and "yes" in predicted[1] and "no" in predicted[2]


def test_the_epochs_batches_hold_every_training_row_once_in_a_seeded_order(tmp_path, small_blocks):
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data.stream_prepare import prepare_streamed
    data = prepare_streamed(DataConfig(train=_write(tmp_path, "csv"), target="label", validation_split=0.2), "classification", 1)
    source = data.train.x.source
    assert len(source.blocks) > 10 and data.train.y.dtype == np.uint8  # every row's target kept: a byte each
    orders = [np.concatenate([p for p, _, _ in source.epoch(e, True)]) for e in (1, 1, 2)]
    np.testing.assert_array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[0], orders[2])
    assert sorted(orders[0].tolist()) == sorted(orders[2].tolist()) and len(orders[0]) == len(data.train.y)
    sizes = [len(b[0]) for b in rebatched(((p, x) for p, x, _ in source.epoch(1, True)), 50)]
    assert sizes[:-1] == [50] * (len(sizes) - 1) and sum(sizes) == len(orders[0])
    whole = data.train.x[0:len(data.train.y)]  # evaluation's in-order view: every training row, normalized
    assert whole.shape == (len(data.train.y), data.sample_shape[0])
    assert abs(float(whole[:, 0].mean())) < 1e-3  # the number column, standardized with exact moments


@pytest.mark.parametrize("change, named", [
    ({"data": {"test": "t.csv"}}, "data.validation / data.test"),
    ({"data": {"shape": [2]}}, "image rows"),
])
def test_unsupported_settings_are_refused_naming_data_stream(tmp_path, capsys, small_blocks, change, named):
    config = yaml.safe_load(open(_config(tmp_path, _write(tmp_path, "csv"))))
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, err = run_cli(capsys, "train", path, "--out", tmp_path / "bad")
    assert code == 2, out + err
    assert "data.stream" in err and named in err and "data.stream: false" in err and "Traceback" not in err


def test_cross_validation_and_a_compressed_file_are_refused(tmp_path, capsys, small_blocks):
    config = _config(tmp_path, _write(tmp_path, "csv"))
    code, out, err = run_cli(capsys, "train", config, "--folds", "3", "--out", tmp_path / "cv")
    assert code == 2 and "cross-validation" in err and "data.stream" in err, out + err
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(b"")
    code, out, err = run_cli(capsys, "train", _config(tmp_path, gz), "--out", tmp_path / "gz")
    assert code == 2 and "data.stream" in err and "Traceback" not in err, out + err


@pytest.mark.parametrize("pieces, size", [([5, 3, 10, 1, 7], 4), ([32], 8), ([3, 3], 10), ([], 3), ([9, 9, 9], 9)])
def test_pieces_regroup_into_full_batches_in_order(pieces, size):
    """Every row once, in order, in batches of `size` but the last (each piece joined once, not per batch)."""
    starts = np.cumsum([0, *pieces])
    out = list(rebatched(iter([(np.arange(a, b), -np.arange(a, b)) for a, b in zip(starts, starts[1:])]), size))
    rows = np.concatenate([x for x, _ in out]) if out else np.zeros(0)
    np.testing.assert_array_equal(rows, np.arange(sum(pieces)))
    assert all(len(x) == size for x, _ in out[:-1]) and all((y == -x).all() for x, y in out)


def _task_config(tmp_path, data, task: str):
    """A streamed config for `data`'s "target": a regression (one linear output, mse) or multi-label
    (sigmoid outputs, binary cross-entropy) head."""
    config = yaml.safe_load(open(_config(tmp_path, data, target="target")))
    config["model"]["layers"][-1] = {"type": "dense", "units": 1 if task == "regression" else 2,
                                     "activation": "linear" if task == "regression" else "sigmoid"}
    config["loss"] = "mse" if task == "regression" else "binary_cross_entropy"
    path = tmp_path / f"{task}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _target_file(tmp_path, task: str, rows: int = ROWS):
    """A regression target in the hundreds (so it must be scaled) or `|`-separated label sets."""
    cols = _columns(rows)
    rng = np.random.default_rng(8)
    a = np.nan_to_num(cols["a"], nan=10.0)
    if task == "regression":
        target = (500 + 40 * ((a - 10) / 4 + cols["b"]) + rng.standard_normal(rows)).round(3).astype(str)
    else:
        up, blue = (a - 10) / 4 + cols["b"] > 0, cols["kind"] == "blue"
        target = np.array(["|", "up", "blue", "blue|up"])[up + 2 * blue]
    path = tmp_path / f"{task}.csv"
    lines = ["a,b,kind,target"] + [f"{'' if np.isnan(x) else f'{x:.6g}'},{b:.6g},{k},{t}"
                                   for x, b, k, t in zip(cols["a"], cols["b"], cols["kind"], target)]
    path.write_text("\n".join(lines) + "\n")
    return path, target


@pytest.mark.parametrize("task", ["regression", "multilabel"])
def test_regression_and_multilabel_targets_stream(tmp_path, capsys, small_blocks, task):
    from magmadnn_cli.training import modelfile
    data, target = _target_file(tmp_path, task)
    path = _task_config(tmp_path, data, task)
    code, out, err = run_cli(capsys, "train", path, "--out", tmp_path / "run")
    assert code == 0, out + err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    saved = modelfile.load(tmp_path / "run" / "model.npz")
    assert saved.task == task
    codes = stream.split_codes(np.arange(ROWS), 5, 0.15, 0.15)
    if task == "regression":  # scaled as the in-memory path scales: mean and std of the training targets
        train = target[codes == stream.TRAIN].astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(saved.targets.shift, [train.mean()], rtol=1e-6)
        np.testing.assert_allclose(saved.targets.spread, [train.std()], rtol=1e-6)
        assert metrics["test"]["r2"] > 0.8
    else:
        assert sorted(saved.classes) == ["blue", "up"] and metrics["test"]["subset_accuracy"] > 0.8
    held = tmp_path / "test_rows.csv"  # the run's test rows alone, scored in memory by evaluate
    lines = data.read_text().splitlines()
    held.write_text("\n".join([lines[0]] + [lines[i + 1] for i in np.flatnonzero(codes == stream.TEST)]) + "\n")
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", held, "--json")
    assert code == 0, out + err
    scored = json.loads(out)
    for key in ("r2", "mse", "mae") if task == "regression" else ("accuracy", "subset_accuracy", "micro_f1"):
        assert metrics["test"][key] == pytest.approx(scored[key], rel=1e-5), key


def test_a_normalization_that_overflows_is_refused_as_in_memory(tmp_path, capsys, small_blocks):
    """data.normalize: minmax of a column reaching +-3e38 does not fit float32: the streamed fit makes
    Normalizer.fit's check (the same message as the in-memory run's)."""
    data = _write(tmp_path, "csv")
    rows = data.read_text().splitlines()
    rows[0] = "big," + rows[0]
    rows[1:] = [f"{3e38 if i % 2 else -3e38}," + r for i, r in enumerate(rows[1:])]
    data.write_text("\n".join(rows) + "\n")
    errors = []
    for stream_it in (False, True):
        code, out, err = run_cli(capsys, "train", _config(tmp_path, data, stream=stream_it, normalize="minmax"),
                                 "--out", tmp_path / f"run{stream_it}")
        assert code == 2 and "Traceback" not in err, out + err
        errors.append(err)
    assert "cannot scale column 'big'" in errors[1] and "float32" in errors[1], errors[1]
    assert errors[0].split(":", 1)[1] == errors[1].split(":", 1)[1]


def test_category_values_of_blocks_read_as_numbers_are_categories(tmp_path, monkeypatch, small_blocks):
    """A code column whose early blocks hold numbers only and later ones text: every training value is
    a category, not only the sample's; too many distinct numbers to collect are refused, named."""
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.data import stream_prepare
    from magmadnn_cli.errors import DataError
    monkeypatch.setattr(stream_prepare, "SAMPLE_ROWS", 40)  # a sample that misses most codes
    rows = 1000
    codes = np.concatenate([(np.arange(700) % 150 + 1000).astype(str), np.array(["A7", "B8", "C9"])[np.arange(300) % 3]])
    path = tmp_path / "codes.csv"
    path.write_text("code,x,label\n" + "".join(f"{c},{i % 7},{'yes' if i % 2 else 'no'}\n" for i, c in enumerate(codes)))
    cfg = DataConfig(train=path, target="label", validation_split=0.2)
    data = stream_prepare.prepare_streamed(cfg, "classification", 3)
    column = next(c for c in data.encoder.columns if c.name == "code")
    train = stream.split_codes(np.arange(rows), 3, 0.2, 0.0) == stream.TRAIN
    assert column.kind == "category" and set(codes[train]) <= set(column.categories)
    from magmadnn_cli.data import stream_fit  # (the fitting passes' module)
    monkeypatch.setattr(stream_fit, "DISTINCT_NUMBERS", 100)
    with pytest.raises(DataError, match="'code'.*over 100 distinct.*data.columns.code.*data.stream: false"):
        stream_prepare.prepare_streamed(cfg, "classification", 3)
