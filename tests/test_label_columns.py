"""A multi-label target given as 0/1 columns (`data.target: [north, east, far]`, one column per label):
it trains the model that the same labels written as one column of `|`-separated cells train (bit for
bit), predict and evaluate read it, and bad label cells, absent label columns and a loss that is not
binary are refused with the fix."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import run_cli, saved_weights, train_on, write_csv

LABELS = ("north", "east", "far")


def _points(n: int = 160, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    p = np.round(r.normal(size=(n, 2)), 4)
    flags = np.stack([p[:, 1] > 0, p[:, 0] > 0, np.hypot(p[:, 0], p[:, 1]) > 1.2], axis=1)
    return p, flags


def _write(folder, p, flags, as_columns: bool, truth=("1", "0")) -> None:
    if as_columns:
        rows = [[x, y, *(truth[0] if f else truth[1] for f in row)] for (x, y), row in zip(p, flags)]
        write_csv(folder / "tags.csv", ["x", "y", *LABELS], rows)
    else:
        cells = ["|".join(n for n, f in zip(LABELS, row) if f) or "|" for row in flags]
        write_csv(folder / "tags.csv", ["x", "y", "tags"], [[x, y, c] for (x, y), c in zip(p, cells)])


CONFIG = """\
seed: 3
device: cpu
data: {{train: tags.csv, target: {target}, validation_split: 0.2, test_split: 0.2, normalize: standard}}
model: {{layers: [{{type: dense, units: 16, activation: tanh}}, {{type: dense, units: 3, activation: sigmoid}}]}}
loss: {loss}
optimizer: {{type: adam, learning_rate: 0.02}}
training: {{epochs: 6, batch_size: 16}}
"""


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same labels as 0/1 columns (True) and as label cells (False), each trained."""
    root, results = tmp_path_factory.mktemp("labels"), {}
    p, flags = _points()
    for as_columns in (True, False):
        folder = root / ("columns" if as_columns else "cells")
        folder.mkdir()
        _write(folder, p, flags, as_columns)
        target = f"[{', '.join(LABELS)}]" if as_columns else "tags"
        (folder / "c.yaml").write_text(CONFIG.format(target=target, loss="binary_cross_entropy"))
        results[as_columns] = folder
        train_on(folder / "run", [], config=folder / "c.yaml")
    return results


def test_label_columns_train_the_model_label_cells_train(both):
    columns, cells = saved_weights(both[True] / "run"), saved_weights(both[False] / "run")
    assert columns.keys() == cells.keys() and columns
    for key in cells:
        np.testing.assert_array_equal(columns[key], cells[key], err_msg=key)
    metrics = json.loads((both[True] / "run" / "metrics.json").read_text())
    assert sorted(metrics["test"]["per_label"]) == sorted(LABELS)
    assert metrics["test"]["subset_accuracy"] == json.loads((both[False] / "run" / "metrics.json").read_text())[
        "test"]["subset_accuracy"]


def test_predict_and_evaluate_read_a_model_of_label_columns(both, capsys):
    folder = both[True]
    code, out, err = run_cli(capsys, "predict", folder / "run" / "model.npz", folder / "tags.csv",
                             "--output", folder / "pred.csv")
    assert code == 0, err
    header = (folder / "pred.csv").read_text().splitlines()[0].split(",")
    assert header[:1] == ["prediction"] and sorted(header[1:4]) == sorted(LABELS)
    code, out, err = run_cli(capsys, "evaluate", folder / "run" / "model.npz", folder / "tags.csv")
    assert code == 0, err
    assert "subset" in (out + err).lower()


def test_true_false_cells_read_as_labels_and_a_blank_cell_leaves_its_row_out(tmp_path, capsys):
    p, flags = _points()
    _write(tmp_path, p, flags, True, truth=("yes", "no"))
    text = (tmp_path / "tags.csv").read_text().splitlines()
    text[5] = text[5].rsplit(",", 1)[0] + ","  # row 4's `far` blank
    (tmp_path / "tags.csv").write_text("\n".join(text) + "\n")
    (tmp_path / "c.yaml").write_text(CONFIG.format(target=f"[{', '.join(LABELS)}]", loss="binary_cross_entropy"))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 0, err
    assert "1 row(s) without a target" in out + err


def test_a_cell_that_is_not_0_or_1_is_named(tmp_path, capsys):
    p, flags = _points()
    _write(tmp_path, p, flags, True)
    text = (tmp_path / "tags.csv").read_text().splitlines()
    text[3] = text[3].rsplit(",", 1)[0] + ",2"
    (tmp_path / "tags.csv").write_text("\n".join(text) + "\n")
    (tmp_path / "c.yaml").write_text(CONFIG.format(target=f"[{', '.join(LABELS)}]", loss="binary_cross_entropy"))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 2 and "Traceback" not in err
    assert "column 'far', data row 3: '2' is not 0 or 1" in err


def test_an_absent_label_column_and_a_loss_that_is_not_binary_are_refused(tmp_path, capsys):
    p, flags = _points()
    _write(tmp_path, p, flags, True)
    (tmp_path / "c.yaml").write_text(CONFIG.format(target="[north, east, farr]", loss="binary_cross_entropy"))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 2 and "no target column 'farr'" in err and "did you mean 'far'?" in err
    (tmp_path / "c.yaml").write_text(CONFIG.format(target=f"[{', '.join(LABELS)}]", loss="cross_entropy"))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run2")
    assert code == 2 and "use loss: binary_cross_entropy" in err


def test_a_label_column_that_is_never_1_is_still_one_of_the_labels(tmp_path, capsys):
    """The listed columns are the labels (a label no training row has is still an output), so a
    validation row or a later file holding it is no unseen label."""
    p, flags = _points()
    flags[:, 2] = False
    _write(tmp_path, p, flags, True)
    (tmp_path / "c.yaml").write_text(CONFIG.format(target=f"[{', '.join(LABELS)}]", loss="binary_cross_entropy"))
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert sorted(metrics["test"]["per_label"]) == sorted(LABELS)


def test_a_headerless_file_predicts_without_its_label_columns(tmp_path, capsys):
    """data.names lists the label columns; a file to predict may leave them all out (as it may leave
    out a single target), in a file or in a served CSV body."""
    from magmadnn_cli.data.records import csv_table
    from magmadnn_cli.data.table import ReadSpec
    from magmadnn_cli.config.loading import load_config
    p, flags = _points()
    rows = [[x, y, *(int(f) for f in row)] for (x, y), row in zip(p, flags)]
    (tmp_path / "tags.csv").write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    config = CONFIG.format(target=f"[{', '.join(LABELS)}]", loss="binary_cross_entropy").replace(
        "target:", f"names: [x, y, {', '.join(LABELS)}], target:")
    (tmp_path / "c.yaml").write_text(config)
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    (tmp_path / "new.csv").write_text("\n".join(f"{x},{y}" for x, y in p[:5]) + "\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "new.csv",
                             "--output", tmp_path / "pred.csv")
    assert code == 0, err
    assert len((tmp_path / "pred.csv").read_text().splitlines()) == 6
    cfg = load_config(tmp_path / "c.yaml", [])
    table = csv_table("0.5,-1.25\n1.0,2.0\n", ReadSpec.of(cfg.data, need_target=False), "request")
    assert table.features == ["x", "y"] and table.x.shape == (2, 2)


def test_a_listed_feature_typed_ignore_is_refused_in_the_config():
    from pydantic import ValidationError
    from magmadnn_cli.config.data import DataConfig
    with pytest.raises(ValidationError, match="'y' is listed in data.features and typed ignore"):
        DataConfig(train="t.csv", target="label", features=["x", "y"], columns={"y": "ignore"})
    with pytest.raises(ValidationError, match=re.escape("label column 'a|b' holds '|', which separates labels")):
        DataConfig(train="t.csv", target=["a|b", "c"])


def test_evaluate_read_in_chunks_leaves_out_rows_without_a_target_and_reads_label_columns(both, capsys, monkeypatch):
    """evaluate on a file over the memory budget (read chunk by chunk) scores what the whole read
    scores: label columns made label sets, a row with a blank label cell left out and said."""
    from magmadnn_cli.commands import evaluate
    folder = both[True]
    text = (folder / "tags.csv").read_text().splitlines()
    text[2] = text[2].rsplit(",", 1)[0] + ","
    (folder / "blank.csv").write_text("\n".join(text) + "\n")
    code, out, err = run_cli(capsys, "evaluate", folder / "run" / "model.npz", folder / "blank.csv", "--json")
    assert code == 0, err
    whole = json.loads(out)
    monkeypatch.setattr(evaluate, "over_budget", lambda path: True)
    code, out, err = run_cli(capsys, "evaluate", folder / "run" / "model.npz", folder / "blank.csv", "--json")
    assert code == 0, err
    chunked = json.loads(out)
    assert "evaluated in 1 chunk(s)" in err and "1 row(s) without a target" in err and chunked["rows"] == whole["rows"] == len(text) - 2
    assert chunked["subset_accuracy"] == whole["subset_accuracy"]


def test_a_run_that_would_stream_refuses_label_columns_by_name(tmp_path, monkeypatch):
    from magmadnn_cli.config.loading import load_config
    from magmadnn_cli.data import stream_prepare
    from magmadnn_cli.errors import DataError
    p, flags = _points()
    _write(tmp_path, p, flags, True)
    (tmp_path / "c.yaml").write_text(CONFIG.format(target=f"[{', '.join(LABELS)}]", loss="binary_cross_entropy")
                                     .replace("normalize: standard", "normalize: standard, stream: auto"))
    monkeypatch.setattr(stream_prepare, "over_budget", lambda path: True)
    with pytest.raises(DataError, match="several 0/1 columns is not streamed yet.*data.stream: false"):
        stream_prepare.streaming(load_config(tmp_path / "c.yaml", []), 1, None)


def test_label_columns_are_read_by_pyarrow_as_the_line_reader_reads_them(tmp_path, monkeypatch):
    """A CSV of 0/1 label columns takes pyarrow's whole-file reader (it took the line reader, 2.4x
    slower on 300,000 rows) and gives the very table the line reader gives: every spelling of a
    flag, blanks and NA, spaces, a column that is never 1, and more labels than a byte holds."""
    from magmadnn_cli.config.schema import DataConfig
    from magmadnn_cli.data import arrow_csv, readers
    from magmadnn_cli.data.table import ReadSpec
    rng = np.random.default_rng(3)
    names = [f"tag{i}" for i in range(11)]  # 11 labels: two bytes of bits a row
    spellings = np.array(["1", "0", " 1", "0 ", "TRUE", "false", "yes", "No", "1", "0"])
    cells = spellings[rng.integers(0, len(spellings), (300, len(names)))]
    cells[:, 4] = "0"  # never 1
    cells[7, 2], cells[19, 5] = "", "NA"  # those rows have no target
    x = rng.normal(size=(300, 2)).round(3)
    lines = ["a,b," + ",".join(names)] + [f"{r[0]},{r[1]}," + ",".join(c) for r, c in zip(x, cells)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    spec = ReadSpec.of(DataConfig.model_validate({"train": str(tmp_path / "t.csv"), "target": names}))
    typed = []
    monkeypatch.setattr(readers, "read_typed", lambda *a, **k: typed.append(1) or arrow_csv.read_typed(*a, **k))
    fast = readers.read_csv(tmp_path / "t.csv", spec)
    assert typed and fast.kept == {}
    slow = readers.read_csv(tmp_path / "t.csv", spec, fast=False)
    assert fast.y.tolist() == slow.y.tolist() and np.array_equal(fast.x, slow.x)
    assert len(fast.y) == 298 and any("data rows 8, 20" in note for note in fast.notes)  # left out, said
    assert not any("tag4" in cell for cell in fast.y)
    row = cells[0]
    assert fast.y[0] == "".join(f"{n}|" for n, c in zip(names, row) if c.strip().lower() in ("1", "true", "yes"))
