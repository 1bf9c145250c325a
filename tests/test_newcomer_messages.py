"""What a newcomer met with their own files, each said so it can be acted on: a 3-class target under
binary_cross_entropy, Keras' `lr`, a currency target, JSON Lines given as CSV, a predict file with
no rows, column names that differ only in case, and rows that hold no feature at all."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import project, run_cli


@pytest.fixture
def model(capsys, tmp_path):
    config = project(tmp_path)
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    return tmp_path / "run"


def test_three_classes_under_binary_cross_entropy_name_the_fix(capsys, tmp_path):
    config = project(tmp_path)
    code, _, err = run_cli(capsys, "train", config, "--set", "loss=binary_cross_entropy", "--set",
                           "model.layers.1={type: dense, units: 1, activation: sigmoid}", "--out", tmp_path / "r")
    said = " ".join(err.split())
    assert code == 2 and "needs exactly 2 classes; the target has 3" in said, said
    assert "use loss: cross_entropy with an output layer of 3 units (activation: softmax)" in said, said


@pytest.mark.parametrize("key, meant", [("optimizer.lr", "learning_rate"), ("training.max_epochs", "epochs")])
def test_other_tools_key_names_are_pointed_at_ours(capsys, tmp_path, key, meant):
    code, _, err = run_cli(capsys, "validate", project(tmp_path), "--set", f"{key}=3")
    assert code == 2 and f"did you mean {meant!r}?" in err, err


def test_the_output_layer_of_one_unit_is_said_in_the_singular(capsys, tmp_path):
    code, _, err = run_cli(capsys, "validate", project(tmp_path), "--set",
                           "model.layers.1={type: dense, units: 1, activation: softmax}")
    assert code == 2 and "the output layer has 1 unit; expected 3" in err, err


def test_a_currency_target_is_named_as_amounts_not_labels(capsys, tmp_path):
    rows = [f'{s},"${s * 123.45:,.2f}"' for s in range(50, 250)]
    (tmp_path / "house.csv").write_text("size,price\n" + "\n".join(rows) + "\n")
    (tmp_path / "h.yaml").write_text("name: h\ndata: {train: house.csv, target: price}\n"
                                     "model: {layers: [{type: dense, units: 1}]}\nloss: mse\noptimizer: adam\n")
    code, _, err = run_cli(capsys, "train", tmp_path / "h.yaml", "--out", tmp_path / "r")
    said = " ".join(err.split())
    assert code == 2 and "'$' signs, which are not read as numbers" in said and "cross_entropy" not in said, said


@pytest.mark.parametrize("stdin", [True, False])
def test_json_lines_given_as_csv_name_the_format(capsys, tmp_path, monkeypatch, model, stdin):
    import io
    lines = '{"f1": 1, "f2": 2, "f3": 3, "f4": 4}\n{"f1": 4, "f2": 3, "f3": 2, "f4": 1}\n'
    if stdin:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(lines.encode())))
        source = "-"
    else:
        (tmp_path / "new.csv").write_text(lines)
        source = tmp_path / "new.csv"
    code, out, err = run_cli(capsys, "predict", model, source)
    said = " ".join(err.split())
    assert code == 2 and not out and "JSON Lines (one object a line), read as CSV text" in said, said
    assert ".jsonl" in said and ("a pipe takes CSV text" in said) == stdin


def test_a_file_of_a_header_and_no_rows_predicts_nothing_and_says_so(capsys, tmp_path, model):
    """A batch with nothing new: the header alone, exit 0 (it failed pipelines with exit 2)."""
    (tmp_path / "none.csv").write_text("f1,f2,f3,f4\n")
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "none.csv", "--proba")
    assert code == 0 and out.splitlines() == ["prediction,prob_a,prob_b,prob_c"], out
    assert "no data rows; the output holds the header alone" in err
    (tmp_path / "other.csv").write_text("a,b\n")  # its columns are still checked
    assert run_cli(capsys, "predict", model, tmp_path / "other.csv")[0] == 2


def test_columns_that_differ_only_in_case_are_named_in_pairs(capsys, tmp_path, model):
    (tmp_path / "new.csv").write_text("F1,f2,F3,f4\n1,2,3,4\n")
    code, _, err = run_cli(capsys, "predict", model, tmp_path / "new.csv")
    said = " ".join(err.split())
    assert code == 2 and "names differ only in case ('F1' for 'f1', 'F3' for 'f3')" in said, said
    code, _, err = run_cli(capsys, "predict", model, tmp_path / "new.csv", "--keep", "f1")
    assert code == 2 and "'F1' for 'f1'" in " ".join(err.split()), err


def test_rows_of_blanks_are_named_with_what_their_predictions_are(capsys, tmp_path, model):
    (tmp_path / "new.csv").write_text("f1,f2,f3,f4\n4,0,0,0\n,,,\n0,4,0,0\n , ,,\n")
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "new.csv")
    said = " ".join(err.split())
    assert code == 0 and len(out.splitlines()) == 5, out  # every row keeps its place
    assert "2 row(s) hold no feature at all, every cell missing (data rows 2, 4)" in said, said
    rows = out.splitlines()[1:]
    assert rows[1] == rows[3] and np.unique(rows).size >= 2


def test_a_last_line_cut_short_is_said_so(capsys, tmp_path, model):
    (tmp_path / "cut.csv").write_text("f1,f2,f3,f4\n1,2,3,4\n4,3")  # a download or copy that stopped
    code, _, err = run_cli(capsys, "predict", model, tmp_path / "cut.csv")
    said = " ".join(err.split())
    assert code == 2 and "cut.csv:3: the row has 2 fields; the header has 4 (the file's last line, with no line " \
                         "break after it: cut short?)" in said, said
    (tmp_path / "short.csv").write_text("f1,f2,f3,f4\n1,2,3,4\n4,3\n5,6,7,8\n")  # a short row inside: no such guess
    code, _, err = run_cli(capsys, "predict", model, tmp_path / "short.csv")
    assert code == 2 and "short.csv:3: the row has 2 fields" in err and "cut short" not in err, err
