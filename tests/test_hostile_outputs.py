"""The hostile suite, outputs: nothing the user has is replaced or lost, re-runs never silently
replace a run, live runs never share a folder, and what the tool writes trains again from anywhere.
Each case checks the exit code, the message, no traceback, and that earlier files are byte-identical."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import BLOBS_CONFIG, project, run_cli, snapshot






def _refused(result, *needles):
    code, out, err = result
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    for needle in needles:
        assert needle in " ".join(err.split()), err


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-x", "a/b", "a\x00b", "x" * 101])
def test_run_names_are_one_safe_path_component(name, capsys, tmp_path, monkeypatch):
    config = project(tmp_path, BLOBS_CONFIG.replace("name: blobs", f"name: {name!r}"))
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    _refused(run_cli(capsys, "train", config, "-q"), "name")
    assert snapshot(tmp_path) == before


def test_a_run_refused_after_its_folder_was_made_leaves_no_folders_behind(capsys, tmp_path, monkeypatch):
    """The run folder and every parent the run created (runs/, --out's new parents) go with a refusal."""
    config = project(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    wrong_width = ["--set", "model.layers.1.units=4", "-q"]
    _refused(run_cli(capsys, "train", config, *wrong_width), "the output layer has 4 units")
    _refused(run_cli(capsys, "train", config, "--out", "new/deeper/run", *wrong_width), "4 units")
    _refused(run_cli(capsys, "train", config, "--out", "new/" + "x" * 300 + "/run", "-q"), "cannot create the folder")
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blobs.csv", "c.yaml"]


def test_out_holding_the_users_files_is_refused(capsys, tmp_path, monkeypatch):
    config = project(tmp_path)
    (tmp_path / "config.yaml").write_text("# my hand-commented config\nname: mine\n")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    _refused(run_cli(capsys, "train", config, "--out", ".", "-q"), "--out .: holds files magmadnn did not write",
             "give a new or empty folder")
    _refused(run_cli(capsys, "train", config, "--out", ".", "-q", "--overwrite"), "did not write")
    assert snapshot(tmp_path) == before


def test_a_rerun_writes_a_new_version_and_keeps_the_earlier_run(capsys, tmp_path, monkeypatch):
    config = project(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "train", config, "-q", "--set", "training.epochs=2")[0] == 0
    first = snapshot(tmp_path / "runs" / "blobs")
    code, out, err = run_cli(capsys, "train", config, "--set", "training.epochs=2")
    assert code == 0, err
    assert "runs/blobs holds an earlier run, which is kept; this run writes runs/blobs-2" in " ".join(out.split())
    assert snapshot(tmp_path / "runs" / "blobs") == first
    assert (tmp_path / "runs" / "blobs-2" / "model.npz").exists()


def test_an_explicit_out_holding_a_run_is_refused_unless_overwrite(capsys, tmp_path):
    config = project(tmp_path)
    out = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", out, "-q", "--set", "training.epochs=2")[0] == 0
    before = snapshot(out)
    _refused(run_cli(capsys, "train", config, "--out", out, "-q"), "holds an earlier run", "--overwrite",
             "magmadnn train --resume")
    assert snapshot(out) == before
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q", "--overwrite", "--set", "training.epochs=3")
    assert code == 0, err
    assert snapshot(out)["model.npz"] != before["model.npz"]


def test_a_live_run_holds_its_folder_and_a_dead_ones_lock_is_taken_over(capsys, tmp_path):
    config = project(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket
        (out / ".magmadnn.lock").write_text(f'{{"pid": {sleeper.pid}, "host": "{socket.gethostname()}"}}')
        _refused(run_cli(capsys, "train", config, "--out", out, "-q"), f"another magmadnn (PID {sleeper.pid})")
    finally:
        sleeper.kill()
        sleeper.wait()
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q", "--set", "training.epochs=1")
    assert code == 0, err  # the holder is gone: its lock is stale
    assert not (out / ".magmadnn.lock").exists()


def _model(capsys, tmp_path):
    config = project(tmp_path)
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q", "--set", "training.epochs=2")[0] == 0
    return tmp_path / "run" / "model.npz"


def test_predict_never_writes_over_links_devices_or_its_inputs(capsys, tmp_path):
    model = _model(capsys, tmp_path)
    data = tmp_path / "blobs.csv"
    (tmp_path / "mine.txt").write_text("keep me\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "mine.txt")
    before = snapshot(tmp_path)
    _refused(run_cli(capsys, "predict", model, data, "-o", tmp_path / "link.csv"), "is a symbolic link")
    _refused(run_cli(capsys, "predict", model, data, "-o", "/dev/null"), "not a regular file")
    _refused(run_cli(capsys, "predict", model, data, "-o", data), "is the command's own input")
    _refused(run_cli(capsys, "predict", model, data, "-o", model), "is the command's own input")
    _refused(run_cli(capsys, "predict", model, data, "-o", tmp_path), "is a folder")
    assert snapshot(tmp_path) == before
    code, out, err = run_cli(capsys, "predict", model, data, "-o", "-")
    assert code == 0 and out.splitlines()[0] == "prediction" and len(out.splitlines()) == 121


def test_predict_replaces_an_existing_file_only_with_overwrite(capsys, tmp_path):
    """A newcomer's `predict ... -o churn.yaml` replaced their config with predictions, exit 0."""
    model = _model(capsys, tmp_path)
    data = tmp_path / "blobs.csv"
    (tmp_path / "mine.yaml").write_text("my: config\n")
    before = snapshot(tmp_path)
    _refused(run_cli(capsys, "predict", model, data, "-o", tmp_path / "mine.yaml"),
             f"--output {tmp_path / 'mine.yaml'}: exists; it is not replaced without --overwrite")
    assert snapshot(tmp_path) == before
    _refused(run_cli(capsys, "predict", model, data, "-o", tmp_path / "mine.yaml", "--overwrite"),
             "no output format is written as '.yaml'; name the file .csv, .tsv, .parquet, .feather or .jsonl")
    _refused(run_cli(capsys, "predict", model, data, "-o", tmp_path / "preds.xlsx"), "as '.xlsx'")
    _refused(run_cli(capsys, "predict", model, data, "-o", tmp_path / "p.parquet.gz"),  # it said: as '.parquet'
             "as .parquet.gz (Parquet and Feather compress inside the file)")
    assert snapshot(tmp_path) == before
    (tmp_path / "mine.csv").write_text("old,predictions\n")
    code, _, err = run_cli(capsys, "predict", model, data, "-o", tmp_path / "mine.csv", "--overwrite")
    assert code == 0, err
    assert (tmp_path / "mine.csv").read_text().splitlines()[0] == "prediction"
    code, _, err = run_cli(capsys, "predict", model, data, "--proba", "-o", tmp_path / "p.tsv.gz")
    assert code == 0, err
    import gzip
    assert gzip.decompress((tmp_path / "p.tsv.gz").read_bytes()).decode().splitlines()[0] == "prediction\tprob_a\tprob_b\tprob_c"


def test_tune_over_an_earlier_search_is_refused_with_the_ways_on(capsys, tmp_path):
    config = project(tmp_path, BLOBS_CONFIG.replace("epochs: 15", "epochs: 2")
                      + "search: {space: {optimizer.learning_rate: [0.01, 0.02]}}\n")
    out = tmp_path / "search"
    assert run_cli(capsys, "tune", config, "--out", out, "-q")[0] == 0
    before = snapshot(out)
    _refused(run_cli(capsys, "tune", config, "--out", out, "-q"), "holds an earlier search", "--overwrite",
             "magmadnn tune --resume")
    assert snapshot(out) == before
    assert run_cli(capsys, "tune", config, "--out", out, "-q", "--overwrite")[0] == 0


def test_written_configs_train_again_from_any_directory_bit_for_bit(capsys, tmp_path, monkeypatch):
    project(tmp_path, BLOBS_CONFIG.replace("seed: 1\n", "")  # the drawn seed is recorded
                      + "search: {space: {optimizer.learning_rate: [0.01, 0.02]}}\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "train", "c.yaml", "--out", "first", "-q", "--set", "training.epochs=3")[0] == 0
    assert run_cli(capsys, "tune", "c.yaml", "--out", "search", "-q", "--set", "training.epochs=2")[0] == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = run_cli(capsys, "train", tmp_path / "first" / "config.yaml", "--out", "again", "-q")
    assert code == 0, err
    with np.load(tmp_path / "first" / "model.npz") as a, np.load(elsewhere / "again" / "model.npz") as b:
        for key in (k for k in a.files if k.startswith("weights/")):
            assert np.array_equal(a[key], b[key]), key
    code, _, err = run_cli(capsys, "train", tmp_path / "search" / "best_config.yaml", "--out", "best", "-q")
    assert code == 0, err
    data = yaml.safe_load((tmp_path / "first" / "config.yaml").read_text())["data"]["train"]
    assert os.path.isabs(data) and data == str(tmp_path / "blobs.csv")


def test_data_paths_expand_home_and_variables(capsys, tmp_path, monkeypatch):
    config = project(tmp_path, BLOBS_CONFIG.replace("train: blobs.csv", "train: $BLOBS_DIR/blobs.csv"))
    monkeypatch.setenv("BLOBS_DIR", str(tmp_path))
    assert run_cli(capsys, "validate", config)[0] == 0
    monkeypatch.setenv("HOME", str(tmp_path))
    config.write_text(BLOBS_CONFIG.replace("train: blobs.csv", "train: ~/blobs.csv"))
    assert run_cli(capsys, "validate", config)[0] == 0


@pytest.mark.parametrize("layers,expected", [
    ("[{type: dense, units: 8, name: h}, {type: dense, units: 3, activation: softmax, name: h}]",
     "model.layers.1: named 'h', like model.layers.0"),
    ("[{type: dense, units: 8, name: dense_1}, {type: dense, units: 3, activation: softmax}]",
     "model.layers.1: named 'dense_1', like model.layers.0"),
    ("[{type: dense, units: 8, name: 'a/b'}, {type: dense, units: 3, activation: softmax}]", "model.layers.0.name"),
])
def test_layer_names_are_unique_and_safe(layers, expected, capsys, tmp_path):
    text = BLOBS_CONFIG.split("model:")[0] + f"model:\n  layers: {layers}\n" + BLOBS_CONFIG.split("softmax}\n")[1]
    config = project(tmp_path, text)
    _refused(run_cli(capsys, "train", config, "--out", tmp_path / "out", "-q"), expected)
    assert not (tmp_path / "out").exists()


def test_output_files_follow_the_umask(capsys, tmp_path):
    old = os.umask(0o022)
    try:
        model = _model(capsys, tmp_path)
    finally:
        os.umask(old)
    for name in ("model.npz", "metrics.json", "config.yaml"):
        assert stat.S_IMODE((model.parent / name).stat().st_mode) == 0o644, name


def test_resuming_into_another_runs_folder_needs_overwrite(capsys, tmp_path):
    config = project(tmp_path)
    for name in ("a", "b"):
        assert run_cli(capsys, "train", config, "--out", tmp_path / name, "-q", "--set", "training.epochs=1")[0] == 0
    before = snapshot(tmp_path / "b")
    _refused(run_cli(capsys, "train", config, "--resume", tmp_path / "a", "--out", tmp_path / "b", "-q",
                     "--set", "training.epochs=2"), "holds an earlier run", "--overwrite")
    assert snapshot(tmp_path / "b") == before
    code, _, err = run_cli(capsys, "train", config, "--resume", tmp_path / "a", "--out", tmp_path / "c", "-q",
                           "--set", "training.epochs=2")
    assert code == 0, err


def test_overwrite_without_checkpoints_removes_the_old_ones(capsys, tmp_path):
    config = project(tmp_path)
    out = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", out, "-q", "--set", "training.epochs=1")[0] == 0
    assert list((out / "checkpoints").glob("step*.npz"))
    code, _, err = run_cli(capsys, "train", config, "--out", out, "-q", "--overwrite", "--set", "training.epochs=1",
                           "--set", "training.checkpoint=false")
    assert code == 0 and not list((out / "checkpoints").glob("step*.npz")), err


def test_a_folder_whose_marker_was_killed_mid_write_is_the_tools_own(tmp_path):
    """kill -9 between the lock and the marker's rename leaves `.magmadnn.lock` and the marker's
    temporary file: the folder is empty to magmadnn (a resumed search reruns the trial there),
    while any other file still makes it foreign (found by the killed-search test: 1 run in 8)."""
    from magmadnn_cli.training.run_folder import RunFolder
    folder = tmp_path / "trial"
    folder.mkdir()
    (folder / ".magmadnn.lock").write_text("123 host\n")
    (folder / "..magmadnn.ut3rn9ye.tmp").write_text("")
    assert RunFolder(folder).kind() == "empty"
    (folder / "notes.txt").write_text("mine")
    assert RunFolder(folder).kind() == "foreign"
