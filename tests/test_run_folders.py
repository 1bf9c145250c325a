"""One rule for run folders (issue 24): `train`, `train --folds` and `tune` version a default folder
(NAME, NAME-2, ...), refuse an explicit --out holding an earlier run unless --overwrite, and say so only
once the run really writes; `predict` and `evaluate` take a run folder or a model file and say what a
folder without a model is (a cross-validation, an interrupted run) with the command that makes one."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys

import pytest

from conftest import BLOBS_CONFIG, ctrl_c_in_epoch, project, run_cli, snapshot

SHORT = BLOBS_CONFIG.replace("epochs: 15", "epochs: 2")
SEARCH = "search: {space: {optimizer.learning_rate: [0.01, 0.02]}}\n"





def _flat(text: str) -> str:
    return " ".join(text.split())


# -- the same versioning, refusal and flags ----------------------------------------------------------
def test_a_second_tune_writes_a_new_version_and_keeps_the_first(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, SHORT + SEARCH)
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "tune", config, "-q")[0] == 0
    first = snapshot(tmp_path / "runs" / "blobs-tune")
    code, out, err = run_cli(capsys, "tune", config)
    assert code == 0, err
    assert ("runs/blobs-tune holds an earlier search, which is kept; this search writes runs/blobs-tune-2 "
            "(--overwrite replaces the earlier one)") in _flat(out)
    assert snapshot(tmp_path / "runs" / "blobs-tune") == first
    assert (tmp_path / "runs" / "blobs-tune-2" / "model.npz").exists()
    code, _, err = run_cli(capsys, "tune", config, "-q", "--overwrite")
    assert code == 0, err
    assert not (tmp_path / "runs" / "blobs-tune-3").exists()


def test_tune_resume_without_out_continues_the_newest_search(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, SHORT + SEARCH)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert run_cli(capsys, "tune", config, "-q")[0] == 0
    journal = tmp_path / "runs" / "blobs-tune-2" / "trials.jsonl"
    journal.write_text("".join(journal.read_text().splitlines(keepends=True)[:2]))  # killed after trial 0
    code, out, err = run_cli(capsys, "tune", config, "--resume")
    assert code == 0, err
    assert "resuming: 1 of 2 trial(s) already finished in runs/blobs-tune-2/trials.jsonl" in _flat(out)
    assert not (tmp_path / "runs" / "blobs-tune-3").exists()


def test_a_second_cross_validation_writes_a_new_version(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, SHORT)
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "train", config, "--folds", "3", "-q")[0] == 0
    first = snapshot(tmp_path / "runs" / "blobs")
    code, out, err = run_cli(capsys, "train", config, "--folds", "3")
    assert code == 0, err
    assert "runs/blobs holds an earlier run, which is kept; this run writes runs/blobs-2" in _flat(out)
    assert snapshot(tmp_path / "runs" / "blobs") == first and (tmp_path / "runs" / "blobs-2" / "metrics.json").exists()


def test_cross_validation_over_a_trained_run_is_refused_and_overwrite_leaves_no_stale_model(capsys, tmp_path):
    config = project(tmp_path, SHORT)
    out = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", out, "-q")[0] == 0
    before = snapshot(out)
    code, _, err = run_cli(capsys, "train", config, "--folds", "3", "--out", out, "-q")
    assert code == 2 and "holds an earlier run" in _flat(err) and "--overwrite" in err, err
    assert snapshot(out) == before
    code, _, err = run_cli(capsys, "train", config, "--folds", "3", "--out", out, "-q", "--overwrite")
    assert code == 0, err
    assert not (out / "model.npz").exists() and not list(out.glob("checkpoints/*.npz"))  # the replaced run's
    assert "epoch" not in (out / "metrics.csv").read_text().splitlines()[0]  # the folds', not the replaced run's
    code, _, err = run_cli(capsys, "evaluate", out, tmp_path / "blobs.csv")
    assert code == 2 and "cross-validation" in err


def test_a_run_that_fails_before_writing_anything_leaves_no_folder(capsys, tmp_path, monkeypatch):
    """A run writes its config.yaml as it starts; one that then fails (diverged in its first epoch)
    leaves no run folder for the next run to step around."""
    config = project(tmp_path, SHORT)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "train", config, "--set", "optimizer.learning_rate=1e30", "--set",
                           "model.layers.0.activation=linear")
    assert code == 2 and "learning rate" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_resumed_runs_config_yaml_is_the_config_it_resumes_with(capsys, tmp_path, monkeypatch):
    """Resumed with more epochs and stopped again: the command the folder then offers continues to
    the new count (config.yaml was the first start's, 2 epochs: that command was refused)."""
    config = project(tmp_path, SHORT)
    run = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", run, "-q")[0] == 0
    ctrl_c_in_epoch(monkeypatch, 3)
    code, _, err = run_cli(capsys, "train", config, "--resume", run, "-q", "--set", "training.epochs=4",
                           "--set", "training.checkpoint.on_signal=false")
    assert code == 130, err
    monkeypatch.undo()
    (run / "model.npz").unlink()
    code, _, err = run_cli(capsys, "predict", run, tmp_path / "blobs.csv")
    command = shlex.split(_flat(err).split("continue it with: ")[1])
    assert command[:2] == ["magmadnn", "train"] and command[2] == str(run / "config.yaml"), err
    code, _, err = run_cli(capsys, *command[1:], "-q")
    assert code == 0, err
    assert json.loads((run / "metrics.json").read_text())["epochs_run"] == 4


# -- nothing claims a folder before the run's checks have passed -----------------------------------
WRONG_WIDTH = ("--set", "model.layers.1.units=4")


def test_a_cross_validation_that_fails_its_checks_claims_no_folder(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, SHORT)
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "train", config, "--folds", "3", "-q")[0] == 0
    code, out, err = run_cli(capsys, "train", config, "--folds", "3", *WRONG_WIDTH)
    assert code == 2 and "the output layer has 4 units" in err
    assert "runs/blobs-2" not in out + err and "earlier run" not in out + err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["blobs"]


def test_a_search_that_fails_its_checks_claims_no_folder(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, SHORT + SEARCH)
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "tune", config, "-q")[0] == 0
    code, out, err = run_cli(capsys, "tune", config, "--set", "search.space={optimizer.learning_rate: "
                             "{loguniform: [0.001, 0.1]}}", "--set", "search.method=grid")
    assert code == 2 and "grid search needs lists of values" in err, err
    assert "blobs-tune-2" not in out + err and "earlier search" not in out + err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["blobs-tune"]


def test_a_training_that_fails_its_checks_claims_no_folder(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, SHORT)
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "train", config, "-q")[0] == 0
    code, out, err = run_cli(capsys, "train", config, *WRONG_WIDTH)
    assert code == 2 and "the output layer has 4 units" in err
    assert "runs/blobs-2" not in out + err and "earlier run" not in out + err


def _killed_before_writing(folder, pid: int) -> None:
    """What a run killed before its first output leaves (mpiexec dead of SIGPIPE, a SIGKILL): the
    marker and the lock of process `pid`, nothing else."""
    folder.mkdir(parents=True)
    (folder / ".magmadnn").write_text(json.dumps({"kind": "run"}))
    (folder / ".magmadnn.lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))


def test_a_run_killed_before_writing_anything_leaves_a_folder_the_next_run_takes(capsys, tmp_path):
    """Nothing of value is there, so neither --overwrite nor a --resume (no checkpoint) is asked for."""
    config, out = project(tmp_path, SHORT), tmp_path / "killed"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _killed_before_writing(out, dead.pid)
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q")
    assert code == 0, err
    assert (out / "model.npz").is_file() and not (out / ".magmadnn.lock").exists()


def test_a_folder_a_live_run_has_only_begun_is_refused_naming_it(capsys, tmp_path):
    config, out = project(tmp_path, SHORT), tmp_path / "starting"
    _killed_before_writing(out, os.getppid())  # alive: as a run that has not written yet
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q")
    assert code == 2 and f"another magmadnn (PID {os.getppid()}) is writing this folder now" in _flat(err)
    assert sorted(p.name for p in out.iterdir()) == [".magmadnn", ".magmadnn.lock"]


# -- regression folds are shuffled, not stratified ------------------------------------------------
def test_cross_validation_names_its_folds_by_the_task(capsys, tmp_path):
    config = project(tmp_path, SHORT)
    code, out, err = run_cli(capsys, "train", config, "--folds", "3", "--out", tmp_path / "classes")
    assert code == 0 and "3-fold cross-validation (stratified, seed 1)" in out, err
    regression = SHORT.replace("target: label", "target: f4\n  features: [f1, f2, f3]").replace(
        "units: 3, activation: softmax", "units: 1").replace("cross_entropy", "mse")
    config.write_text(regression)
    code, out, err = run_cli(capsys, "train", config, "--folds", "3", "--out", tmp_path / "values")
    assert code == 0, err
    assert "3-fold cross-validation (shuffled, seed 1)" in out and "stratified" not in out


# -- predict and evaluate: a run folder or a model file -------------------------------------------
def test_predict_and_evaluate_take_a_run_folder_or_its_model_file(capsys, tmp_path):
    config = project(tmp_path, SHORT)
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    data = tmp_path / "blobs.csv"
    by_file = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", data)
    by_folder = run_cli(capsys, "predict", tmp_path / "run", data)
    assert by_folder[0] == 0 and by_folder[1] == by_file[1] and len(by_folder[1].splitlines()) == 121
    assert run_cli(capsys, "evaluate", tmp_path / "run", data, "--json")[1] == \
        run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", data, "--json")[1]
    assert run_cli(capsys, "predict", tmp_path / "run", data, "-o", tmp_path / "run" / "model.npz")[0] == 2


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_cross_validation_folder_holds_no_model_and_says_how_to_train_one(command, capsys, tmp_path):
    config = project(tmp_path, SHORT)
    cv = tmp_path / "cv"
    assert run_cli(capsys, "train", config, "--folds", "3", "--out", cv, "-q")[0] == 0
    code, out, err = run_cli(capsys, command, cv, tmp_path / "blobs.csv")
    assert code == 2 and "Traceback" not in out + err
    said = _flat(err)
    assert f"{cv} is a cross-validation (train --folds 3), which writes no model" in said, err
    train = f"magmadnn train {cv / 'config.yaml'} --out {tmp_path / 'cv-model'}"
    assert train in said
    code, _, err = run_cli(capsys, *shlex.split(train)[1:], "-q")  # the command it gives works as given
    assert code == 0 and (tmp_path / "cv-model" / "model.npz").exists(), err
    assert run_cli(capsys, command, tmp_path / "cv-model", tmp_path / "blobs.csv")[0] == 0


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_an_interrupted_run_folder_says_so_with_the_resume_command(command, capsys, tmp_path):
    """What a run stopped before its end leaves: its marker, checkpoints and the config.yaml it wrote
    as it started, no model file yet (a folder of an older magmadnn: no config.yaml either)."""
    config = project(tmp_path, SHORT)
    run = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", run, "-q")[0] == 0
    for name in ("model.npz", "metrics.json", "metrics.csv"):
        (run / name).unlink()
    code, out, err = run_cli(capsys, command, run, tmp_path / "blobs.csv")
    assert code == 2 and "Traceback" not in out + err
    said = _flat(err)
    assert f"{run}: the run was interrupted before its model was written" in said, err
    assert f"magmadnn train {run / 'config.yaml'} --resume {run}" in said and "CONFIG" not in said, said
    code, _, err = run_cli(capsys, "train", run / "config.yaml", "--resume", run, "-q")  # that command
    assert code == 0 and (run / "model.npz").exists(), err
    for name in ("model.npz", "metrics.json", "metrics.csv", "config.yaml"):
        (run / name).unlink()
    code, _, err = run_cli(capsys, command, run, tmp_path / "blobs.csv")
    assert code == 2 and f"magmadnn train CONFIG --resume {run}" in _flat(err), err


def test_a_folder_that_is_no_run_says_what_it_expected(capsys, tmp_path):
    project(tmp_path, SHORT)
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "predict", tmp_path / "empty", tmp_path / "blobs.csv")
    assert code == 2 and f"{tmp_path / 'empty'}: no model.npz in this folder" in _flat(err), err


# -- predict --strict to stdout -------------------------------------------------------------------
def test_predict_strict_to_stdout_writes_nothing_before_failing(capsys, tmp_path):
    (tmp_path / "train.csv").write_text("color,size,label\n" + "".join(
        f"{c},{i % 5},{ {'red': 'warm', 'blue': 'cold'}[c]}\n" for i, c in enumerate(["red", "blue"] * 20)))
    (tmp_path / "c.yaml").write_text(SHORT.replace("blobs.csv", "train.csv").replace("units: 3", "units: 2"))
    assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    (tmp_path / "new.csv").write_text("color,size\nred,1\npurple,2\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "new.csv", "--strict")
    assert code == 2 and "category 'purple' was not in the training data" in err, err
    assert out == ""


# -- -q: one line, where the results went ---------------------------------------------------------
def test_quiet_cross_validation_and_search_say_only_where_the_results_went(capsys, tmp_path):
    config = project(tmp_path, SHORT + SEARCH)
    code, out, err = run_cli(capsys, "train", config, "--folds", "3", "--out", tmp_path / "cv", "-q")
    assert code == 0 and out.splitlines() == [f"wrote {tmp_path / 'cv'}/metrics.json, metrics.csv, config.yaml "
                                              "(no model: train without --folds for one)"], out
    code, out, err = run_cli(capsys, "tune", config, "--out", tmp_path / "s", "-q")
    assert code == 0 and len(out.splitlines()) == 1, out
    assert out.startswith("best: trial ") and f"wrote {tmp_path / 's'}/trials.csv" in out
    code, out, err = run_cli(capsys, "tune", config, "--out", tmp_path / "s2")  # trials say no "wrote" of their own
    assert code == 0 and "trials/0" not in out, out


def test_a_run_that_replaces_another_and_fails_leaves_the_old_one_whole(capsys, tmp_path):
    """--overwrite: the replaced run is set aside as the new run starts and put back, model, config,
    metrics and checkpoints together, when the new run fails (here it diverges): the folder never
    offers a model that its config and metrics do not describe, nor loses the one it had."""
    config = project(tmp_path, SHORT)
    out = tmp_path / "r"
    assert run_cli(capsys, "train", config, "--out", out, "-q")[0] == 0
    before = snapshot(out)
    code, _, err = run_cli(capsys, "train", config, "--out", out, "--overwrite", "-q",
                           "--set", "optimizer.learning_rate=1e30", "--set", "optimizer.type=sgd")
    assert code == 2 and "No model file was written" in err
    assert f"the earlier run in {out} is put back as it was" in _flat(err), err
    assert snapshot(out) == before
