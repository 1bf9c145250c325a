"""A category column's missing cells are a category of their own by default (as scikit-learn's
OneHotEncoder and Ludwig do): a blank often says something (no lifeboat: did not survive). Filled
with the most frequent value, that signal was thrown away."""

from __future__ import annotations

import numpy as np

from conftest import run_cli
from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data.prepare import prepare


def _boats(n: int = 400, seed: int = 0) -> str:
    """`boat` is blank exactly for the rows labelled died; `x` is noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, x in enumerate(rng.random(n)):
        lived = rng.random() < 0.4
        boat = "ABCD"[i % 4] if lived else ""
        rows.append(f"{x:.4f},{boat},{'lived' if lived else 'died'}")
    return "x,boat,label\n" + "\n".join(rows) + "\n"


def _config(tmp_path, data: str = "", training: str = "epochs: 3, checkpoint: false", text: str | None = None):
    """boats (or `text`) in b.csv and c.yaml training a softmax layer on it (`data`: more data settings)."""
    (tmp_path / "b.csv").write_text(_boats() if text is None else text)
    (tmp_path / "c.yaml").write_text(
        f"name: b\nseed: 0\ndata: {{train: b.csv, target: label{data}}}\n"
        "model: {layers: [{type: dense, units: 2, activation: softmax}]}\nloss: cross_entropy\n"
        f"optimizer: {{type: adam, learning_rate: 0.05}}\ntraining: {{{training}}}\n")
    return tmp_path / "c.yaml"


def _legacy_fill(monkeypatch) -> None:
    """The earlier default: auto filled a category's missing cells with its most frequent value."""
    from magmadnn_cli.data.column_kinds import CategoryForm
    real = CategoryForm.most_frequent
    monkeypatch.setattr(CategoryForm, "most_frequent", lambda self, column, cells, strategy: real(
        self, column, cells, "most_frequent" if strategy == "auto" else strategy))


def test_missing_cells_are_a_category_of_their_own_and_said_so(tmp_path):
    (tmp_path / "b.csv").write_text(_boats())
    data = prepare(DataConfig(train=tmp_path / "b.csv", target="label", validation_split=0.0), "classification", 0)
    boat = next(c for c in data.encoder.columns if c.name == "boat")
    assert boat.fill == "(missing)" and boat.categories == ["(missing)", "A", "B", "C", "D"]
    assert any("a category of their own, '(missing)': boat" in n for n in data.notes), data.notes
    mode = prepare(DataConfig(train=tmp_path / "b.csv", target="label", validation_split=0.0,
                              missing_values="most_frequent"), "classification", 0)
    assert next(c for c in mode.encoder.columns if c.name == "boat").fill in "ABCD"  # the choice stays


def test_a_real_category_named_like_the_missing_one_keeps_its_own(tmp_path):
    text = _boats().replace(",A,", ",(missing),")
    (tmp_path / "b.csv").write_text(text)
    data = prepare(DataConfig(train=tmp_path / "b.csv", target="label", validation_split=0.0), "classification", 0)
    boat = next(c for c in data.encoder.columns if c.name == "boat")
    assert boat.fill == "(missing 2)" and "(missing)" in boat.categories


def test_a_column_complete_in_training_fills_a_blank_at_predict_with_its_most_frequent_value(tmp_path, capsys):
    """No missing category was learned: a blank at predict is no unseen value (refused under
    unseen_categories: error), but the most frequent one, as before."""
    config = _config(tmp_path, ", unseen_categories: error", text=_boats().replace(",,", ",E,"))
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    (tmp_path / "new.csv").write_text("x,boat\n0.5,\n")
    code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv")
    assert code == 0 and "boat (1: most frequent value 'E')" in err, err


def test_the_missing_category_carries_the_signal_to_the_test_score(tmp_path, capsys):
    config = _config(tmp_path, ", test_split: 0.3", "epochs: 30, checkpoint: false", text=_boats(600))
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    import json
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] == 1.0, metrics  # blank boat <=> died; the mode (A) mixed them with A's
    (tmp_path / "new.csv").write_text("x,boat\n0.5,\n0.5,B\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv")
    assert code == 0 and out.split() == ["prediction", "died", "lived"], (out, err)
    assert "a category of its own '(missing)'" in err, err


def test_a_run_checkpointed_when_blanks_took_the_most_frequent_value_is_told_how_to_continue(tmp_path, capsys,
                                                                                              monkeypatch):
    """A checkpoint from before this default (blanks filled with the most frequent value) was refused
    as 'the training data differs', with no way on; the refusal names the --set that continues it."""
    _config(tmp_path, training="epochs: 2")
    with monkeypatch.context() as before:
        _legacy_fill(before)
        assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--resume", tmp_path / "run",
                           "--set", "training.epochs=3", "-q")
    said = " ".join(err.split())
    fix = "--set 'data.columns.boat={type: category, missing: most_frequent}'"
    assert code == 2 and "a category of their own" in said and fix in said, said
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--resume", tmp_path / "run", "--set",
                           "training.epochs=3", "--set", "data.columns.boat={type: category, missing: most_frequent}",
                           "-q")
    assert code == 0, err


def test_evaluate_on_the_runs_own_split_encodes_with_the_models_encoder(tmp_path, capsys, monkeypatch):
    """`evaluate RUN --split test` fitted the columns again with today's defaults: a model trained
    before the missing-category default got inputs of another width."""
    _config(tmp_path, ", test_split: 0.2", "epochs: 20, checkpoint: false")
    with monkeypatch.context() as before:
        _legacy_fill(before)
        assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    import json
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run", "--split", "test", "--json")
    assert code == 0, err
    recorded = json.loads((tmp_path / "run" / "metrics.json").read_text())["test"]
    assert json.loads(out)["accuracy"] == recorded["accuracy"]


def test_a_column_of_one_value_or_blank_is_kept_as_two_values(tmp_path):
    """'A' or blank: with blanks a category of their own, the column says something (it was left out
    as constant, and the run log said both)."""
    (tmp_path / "b.csv").write_text(_boats().replace(",B,", ",A,").replace(",C,", ",A,").replace(",D,", ",A,"))
    data = prepare(DataConfig(train=tmp_path / "b.csv", target="label", validation_split=0.0), "classification", 0)
    boat = next(c for c in data.encoder.columns if c.name == "boat")
    assert boat.kind == "category" and boat.categories == ["(missing)", "A"], boat
    assert not any("constant columns" in n for n in data.notes), data.notes


def test_the_missing_category_does_not_hide_what_the_values_look_like(tmp_path):
    """US dates and one blank: the date hint was lost, as '(missing)' is no date; counts said it too."""
    rows = [f"{1 + i % 40 % 12}/{13 + i % 40 % 15}/2019,{i % 2}" for i in range(60)]  # 40 dates, day first > 12
    rows[5] = f",{1}"
    (tmp_path / "d.csv").write_text("when,label\n" + "\n".join(rows) + "\n")
    notes = " ".join(prepare(DataConfig(train=tmp_path / "d.csv", target="label", validation_split=0.0),
                             "classification", 0).notes)
    assert "'%m/%d/%Y'" in notes and "'(missing)'" not in notes.split("filled with")[0], notes


def test_an_unseen_category_refused_by_the_models_setting_is_not_blamed_on_strict(tmp_path, capsys):
    config = _config(tmp_path, ", unseen_categories: error", "epochs: 1, checkpoint: false")
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    (tmp_path / "new.csv").write_text("x,boat\n0.5,Z\n")
    for strict in ((), ("--strict",)):
        code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv", *strict)
        said = " ".join(err.split())
        assert code == 2 and "trained with data.unseen_categories: error, which refuses them" in said, said
        assert "without it" not in said
