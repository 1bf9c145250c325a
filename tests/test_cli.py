"""The commands as a user runs them: train -> model.npz -> predict / evaluate; outputs, overrides,
width checks, model-file safety, plain (non-TTY) output."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from magmadnn_cli.core import backend as B
from magmadnn_cli.inference import restore
from magmadnn_cli.training.modelfile import load

from conftest import BLOBS_CONFIG, ROOT, blobs_csv, run_cli, write_csv


def _train(capsys, config, out, *extra):
    code, stdout, stderr = run_cli(capsys, "train", config, "--out", out, *extra)
    assert code == 0, stderr
    return stdout


def test_train_writes_every_output_and_learns(capsys, blobs, tmp_path):
    out = tmp_path / "run"
    stdout = _train(capsys, blobs, out)
    assert {p.name for p in out.iterdir()} == {"model.npz", "metrics.json", "metrics.csv", "config.yaml", "checkpoints",
                                               ".magmadnn"}  # the marker; the lock is gone
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step00000084.npz", "step00000090.npz"]  # 6 steps an epoch, keep 2
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["validation"]["accuracy"] >= 0.95
    assert metrics["train"]["accuracy"] >= 0.95
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert len(rows) == 15 and {"epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr"} <= set(rows[0])
    assert "seed: 1" in (out / "config.yaml").read_text()
    assert "epoch 15 " in stdout and "final metrics" in stdout
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


def test_set_override_reaches_training(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "--set", "training.epochs=2", "--quiet")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs_run"] == 2


def test_epochs_zero_writes_the_initialized_model(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "--set", "training.epochs=0", "-q")
    assert (tmp_path / "run" / "model.npz").exists()


def test_predict_matches_in_process_forward_and_keeps_string_labels(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "-q")
    model = tmp_path / "run" / "model.npz"
    code, _, err = run_cli(capsys, "predict", model, tmp_path / "blobs.csv", "-o", tmp_path / "p.csv", "--proba")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert len(rows) == 120 and set(rows[0]) == {"prediction", "prob_a", "prob_b", "prob_c"}
    saved = load(model)
    net = restore(saved)
    x = np.loadtxt(tmp_path / "blobs.csv", delimiter=",", skiprows=1, usecols=range(4), dtype=np.float32)
    expected = net.predict(saved.normalizer(x))
    got = np.array([[float(r[f"prob_{c}"]) for c in "abc"] for r in rows])
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert [r["prediction"] for r in rows] == [saved.classes[i] for i in expected.argmax(axis=1)]
    assert sum(r["prediction"] == "abc"[i % 3] for i, r in enumerate(rows)) >= 114


def test_small_probabilities_keep_their_digits():
    """A probability of 3e-9 is written as such, not rounded to 0 (a log loss of it would be infinite),
    to the 7 significant digits float32 holds."""
    from types import SimpleNamespace

    from magmadnn_cli.inference.predictor import output_rows
    saved = SimpleNamespace(task="binary", classes=["no", "yes"])
    rows = output_rows(np.array([[3e-9], [0.123456789]], dtype=np.float32), saved, proba=True)
    assert rows[:, 0].tolist() == ["no", "no"]
    assert float(rows[0, 2]) == pytest.approx(3e-9, rel=1e-6) and rows[1, 2] == "0.1234568", rows


def test_predict_to_stdout_and_from_npz(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "-q")
    code, out, _ = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "blobs.csv")
    assert code == 0 and out.splitlines()[0] == "prediction" and len(out.splitlines()) == 121
    x = np.loadtxt(tmp_path / "blobs.csv", delimiter=",", skiprows=1, usecols=range(4), dtype=np.float32)
    np.savez(tmp_path / "x.npz", x=x[:5])
    code, out, _ = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "x.npz")
    assert code == 0 and len(out.splitlines()) == 6


def test_predict_rejects_mismatched_columns_naming_them(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "-q")
    write_csv(tmp_path / "odd.csv", ["f1", "f2", "f9", "f4"], [[1, 2, 3, 4]])
    code, _, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "odd.csv")
    assert code == 2
    said = " ".join(err.split())
    assert "missing feature column(s) f3, which the model reads; the file has f1, f2, f9, f4" in said, said
    assert "add them to the file (blank cells are filled as in training, unless --strict)" in said
    assert "data.features" not in said
    assert "ignoring" not in err
    write_csv(tmp_path / "blank.csv", ["f1", "f2", "f3", "f4"], [[1, 2, "", 4]])  # the fix it gives works
    assert run_cli(capsys, "predict", tmp_path / "run" / "model.npz", tmp_path / "blank.csv")[0] == 0
    _train(capsys, blobs, tmp_path / "complete", "-q", "--set", "data.missing_values=error")
    code, _, err = run_cli(capsys, "predict", tmp_path / "complete", tmp_path / "odd.csv")
    said = " ".join(err.split())
    assert code == 2 and "add them to the file, with their values (the model refuses blank cells" in said, said


def test_evaluate_reports_full_metrics(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "-q")
    blobs_csv(tmp_path / "fresh.csv", n=60, seed=5)
    code, out, _ = run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", tmp_path / "fresh.csv", "--json")
    report = json.loads(out)
    assert code == 0 and report["rows"] == 60
    assert report["accuracy"] >= 0.9 and -1 <= report["mcc"] <= 1
    assert np.sum(report["confusion_matrix"]) == 60
    assert set(report["per_class"]) == {"a", "b", "c"}
    code, out, _ = run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", tmp_path / "fresh.csv")
    assert code == 0 and "confusion matrix" in out and "macro_f1" in out


def test_evaluate_on_a_file_without_the_target_points_at_predict(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "-q")
    blobs_csv(tmp_path / "fresh.csv", n=9, seed=5)
    rows = [line.rsplit(",", 1)[0] for line in (tmp_path / "fresh.csv").read_text().splitlines()]
    (tmp_path / "unlabelled.csv").write_text("\n".join(rows) + "\n")
    model = tmp_path / "run" / "model.npz"
    code, out, err = run_cli(capsys, "evaluate", model, tmp_path / "unlabelled.csv")
    said = " ".join(err.split())
    assert code == 2 and out == "" and "Traceback" not in err
    assert "no target column 'label'" in said and "data.target" not in said, said
    assert f"magmadnn predict {model} {tmp_path / 'unlabelled.csv'}" in said, said


def test_evaluate_on_the_training_file_warns_that_it_holds_the_training_rows(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "-q")
    csv = blobs.parent / "blobs.csv"
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run", csv, "--json")
    assert code == 0 and json.loads(out)["rows"] == 120
    assert f"{csv} is the file this model was trained on" in " ".join(err.split()), err
    assert f"magmadnn evaluate {tmp_path / 'run' / 'model.npz'} --split validation" in " ".join(err.split())
    blobs_csv(tmp_path / "fresh.csv", n=60, seed=5)
    code, _, err = run_cli(capsys, "evaluate", tmp_path / "run", tmp_path / "fresh.csv", "--json")
    assert code == 0 and "trained on" not in err
    _train(capsys, blobs, tmp_path / "all", "-q", "--set", "data.validation_split=0")
    code, _, err = run_cli(capsys, "evaluate", tmp_path / "all", csv)
    assert code == 0 and "the run held out no rows to score" in " ".join(err.split()) and "--split" not in err


def test_init_from_warm_starts_and_checks_shapes(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "a", "-q")
    _train(capsys, blobs, tmp_path / "b", "-q", "--init-from", tmp_path / "a" / "model.npz", "--set", "training.epochs=0")
    wa, wb = load(tmp_path / "a" / "model.npz").weights, load(tmp_path / "b" / "model.npz").weights
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "c", "-q", "--init-from",
                           tmp_path / "a" / "model.npz", "--set", "model.layers.0.units=8")
    assert code == 2 and "dense_0/kernel" in err and "expected shape (4, 8); received (4, 16)" in err


def test_init_from_takes_a_run_folder_or_a_checkpoint(capsys, blobs, tmp_path):
    """A run folder gives its model's weights; a checkpoint (or a folder whose run stopped before its
    model was written) gives the network weights the checkpoint holds."""
    from magmadnn_cli.training.checkpoint import read
    from magmadnn_cli.training.run_folder import checkpoint_files as listing
    _train(capsys, blobs, tmp_path / "a", "-q", "--set", "training.epochs=3")
    model = load(tmp_path / "a" / "model.npz").weights
    newest = listing(tmp_path / "a" / "checkpoints")[-1]
    with np.load(newest, allow_pickle=False) as f:
        in_checkpoint = {k.removeprefix("network/"): f[k] for k in f.files if k.startswith("network/")}
    assert read(newest).meta["global_step"] > 0 and in_checkpoint.keys() == model.keys()
    (tmp_path / "stopped").mkdir()
    (tmp_path / "stopped" / "checkpoints").mkdir()
    (tmp_path / "stopped" / "checkpoints" / newest.name).write_bytes(newest.read_bytes())
    sources = [(tmp_path / "a", tmp_path / "a" / "model.npz", model), (newest, newest, in_checkpoint),
               (tmp_path / "stopped", tmp_path / "stopped" / "checkpoints" / newest.name, in_checkpoint)]
    for source, file, want in sources:
        out = tmp_path / f"from-{source.name}"
        said = _train(capsys, blobs, out, "--init-from", source, "--set", "training.epochs=0")
        got = load(out / "model.npz").weights
        assert all(np.array_equal(got[k], want[k]) for k in want), source
        assert f"starting from the weights of {file}" in " ".join(said.split())
        recorded = json.loads((out / "metrics.json").read_text())["init_from"]
        assert recorded == {"path": str(file), "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}
        assert f"--init-from {file}" in (out / "config.yaml").read_text().splitlines()[0]
    _train(capsys, blobs, tmp_path / "cut", "-q", "--init-from", newest, "--set", "training.epochs=1")
    _train(capsys, blobs, tmp_path / "cut", "-q", "--resume", tmp_path / "cut", "--set", "training.epochs=2")
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["init_from"]["path"] == str(newest)
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "x", "--init-from", tmp_path / "stopped" / "checkpoints" / "none")
    assert code == 2 and "not found" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "y", "--init-from", tmp_path / "empty")
    assert code == 2 and "no model.npz and no checkpoint in this folder" in err


def test_output_width_must_match_the_classes(capsys, blobs, tmp_path):
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "r", "--set", "model.layers.1.units=4")
    assert code == 2
    assert "model.layers.1.units: the output layer has 4 units; expected 3" in err
    assert not (tmp_path / "r").exists()


def test_missing_data_file_is_a_clean_error(capsys, blobs, tmp_path):
    code, out, err = run_cli(capsys, "train", blobs, "--set", f"data.train={tmp_path / 'nope.csv'}")
    assert code == 2 and "Traceback" not in out + err
    assert f"--set data.train={tmp_path / 'nope.csv'}: data.train: {tmp_path / 'nope.csv'} not found" in err


def test_a_data_path_relative_to_the_wrong_folder_names_the_line_the_rule_and_the_file_meant(capsys, tmp_path,
                                                                                           monkeypatch):
    """The config lives in work/, the data beside the working directory: the path is resolved from the
    config's folder (the rule), and the message says so and names the file that does exist."""
    from conftest import BLOBS_CONFIG, blobs_csv
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "c.yaml").write_text(BLOBS_CONFIG)
    blobs_csv(tmp_path / "blobs.csv")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "train", "work/c.yaml")
    message = " ".join(err.split())
    assert code == 2 and "Traceback" not in out + err
    assert (f"work/c.yaml:5: data.train: blobs.csv not found: {tmp_path / 'work' / 'blobs.csv'} (paths in a config "
            f"file are relative to the config file's folder, {tmp_path / 'work'}). {tmp_path / 'blobs.csv'} exists "
            "in the working directory: write data.train: ../blobs.csv") in message
    assert not (tmp_path / "runs").exists()  # nothing claimed or written


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_bytes(b"not a zip at all"), "not a readable magmadnn model file"),
    (lambda p: np.savez(p, x=np.zeros(3)), "not a magmadnn model (no 'format' entry)"),
    (lambda p: np.savez(p, format=np.array([{"evil": 1}], dtype=object)), "refused: the file holds Python objects"),
    (lambda p: p.write_bytes(open(p.with_name("good.npz"), "rb").read()[:300]), "not a readable magmadnn model"),
])
def test_bad_model_files_are_refused(capsys, blobs, tmp_path, make, message):
    _train(capsys, blobs, tmp_path / "run", "-q", "--set", "training.epochs=0")
    (tmp_path / "good.npz").write_bytes((tmp_path / "run" / "model.npz").read_bytes())
    bad = tmp_path / "bad.npz"
    make(bad)
    code, out, err = run_cli(capsys, "predict", bad, tmp_path / "blobs.csv")
    assert code == 2 and message in err and "Traceback" not in out + err


def test_model_file_round_trip_keeps_everything(capsys, blobs, tmp_path):
    _train(capsys, blobs, tmp_path / "run", "-q")
    with np.load(tmp_path / "run" / "model.npz", allow_pickle=False) as f:
        assert str(f["format"]) == "magmadnn-model" and int(f["format_version"]) == 1
        assert {"weights/dense_0/kernel", "weights/dense_0/bias", "weights/dense_1/kernel", "weights/dense_1/bias",
                "norm/shift", "norm/spread", "meta"} <= set(f.files)
    saved = load(tmp_path / "run" / "model.npz")
    assert saved.classes == ["a", "b", "c"] and saved.features == ["f1", "f2", "f3", "f4"]
    assert saved.config.name == "blobs" and saved.task == "classification"
    net = restore(saved)
    assert all(np.array_equal(net.state_dict()[k], saved.weights[k]) for k in saved.weights)


def test_summary_lists_layers_parameters_and_flops(capsys, blobs):
    code, out, _ = run_cli(capsys, "summary", blobs)
    assert code == 0
    assert "dense_0" in out and "(16,)" in out and "131" in out  # 4*16+16 = 80, 16*3+3 = 51 -> 131
    assert "total" in out


def test_summary_shows_a_config_whose_output_does_not_fit_and_refuses_it_as_validate_does(capsys, blobs):
    """summary printed a 2-unit output for 3 classes and exited 0; validate and train refuse it."""
    code, out, err = run_cli(capsys, "summary", blobs, "--set", "model.layers.1.units=2")
    assert code == 2 and "dense_1" in out and "(2,)" in out  # the table, to fix it by
    expected = "--set model.layers.1.units=2: model.layers.1.units: the output layer has 2 units; expected 3"
    assert expected in err, err
    code, _, err = run_cli(capsys, "validate", blobs, "--set", "model.layers.1.units=2")
    assert code == 2 and expected in err, err


def test_summary_counts_the_inputs_the_trained_model_has(capsys, tmp_path):
    """Category columns are one-hot encoded on the training rows only: summary's input width and
    parameter count are those of the model `train` writes (a newcomer saw 446 inputs in summary and
    330 in the model, whose vocabulary had left out the held-out rows' categories)."""
    r = np.random.default_rng(0)
    rows = [[f"c{i % 40}", r.choice(["x", "y"]), round(float(r.normal()), 3), "a" if i % 2 else "b"] for i in range(60)]
    write_csv(tmp_path / "d.csv", ["code", "kind", "f", "label"], rows)  # 20 codes twice, 20 once
    config = tmp_path / "c.yaml"
    config.write_text(BLOBS_CONFIG.replace("blobs.csv", "d.csv").replace("units: 3", "units: 2"))
    run = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", run, "-q", "--set", "training.epochs=1")[0] == 0
    with np.load(run / "model.npz", allow_pickle=False) as f:
        inputs = f["weights/dense_0/kernel"].shape[0]
        params = sum(f[k].size for k in f.files if k.startswith("weights/"))
    code, out, _ = run_cli(capsys, "summary", config)
    assert code == 0
    assert f"each sample's input is {inputs} numbers" in out and inputs < 40 + 2 + 1  # some codes are only in the 12 validation rows
    assert f"{params:,}" in out.split("total")[1]
    caption = f"inputs: code {inputs - 3} (category), kind 2 (category); 1 number column, 1 each"
    assert caption in out, out  # where the width comes from
    code, out, _ = run_cli(capsys, "summary", run)  # the saved model's own encoder says the same
    assert code == 0 and caption in out, out


def test_summary_of_a_saved_model_needs_neither_config_nor_data(capsys, blobs, tmp_path):
    run = tmp_path / "run"
    _train(capsys, blobs, run, "-q", "--set", "training.epochs=1")
    (blobs.parent / "blobs.csv").unlink()  # the model file alone is enough
    blobs.unlink()
    with np.load(run / "model.npz", allow_pickle=False) as f:
        params = sum(f[k].size for k in f.files if k.startswith("weights/"))
    for source in (run, run / "model.npz"):
        code, out, err = run_cli(capsys, "summary", source)
        assert code == 0, err
        assert "each sample's input is 4 numbers" in out and "dense_0" in out and f"{params:,}" in out.split("total")[1]
    code, _, err = run_cli(capsys, "summary", run, "--set", "training.epochs=3")
    assert code == 2 and "--set" in err and "config" in err, err
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    code, _, err = run_cli(capsys, "summary", tmp_path / "other.npz")
    assert code == 2 and "Traceback" not in err and "other.npz" in err, err


def test_non_tty_output_has_no_control_characters(blobs, tmp_path):
    env = dict(os.environ, COLUMNS="100")
    result = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(blobs), "--out", str(tmp_path / "r"),
                             "--set", "training.epochs=3"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    assert [line.split()[1] for line in result.stdout.splitlines() if line.startswith("epoch ")] == ["1", "2", "3"]


@pytest.mark.slow
def test_digits_config_reaches_95_percent_test_accuracy(capsys, tmp_path):
    _train(capsys, ROOT / "configs" / "digits_mlp.yaml", tmp_path / "run", "-q")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.95
    assert B.current() == B.CPU  # a run's backend does not outlive it


def test_checkpoint_false_turns_checkpoints_off(capsys, blobs, tmp_path):
    out = tmp_path / "plain"
    _train(capsys, blobs, out, "--set", "training.checkpoint=false", "--set", "training.epochs=2")
    assert not (out / "checkpoints").exists() and (out / "model.npz").exists()


def test_resuming_a_finished_run_says_so(capsys, blobs, tmp_path):
    out = tmp_path / "done"
    _train(capsys, blobs, out, "--set", "training.epochs=2")
    code, stdout, stderr = run_cli(capsys, "train", blobs, "--resume", out, "--set", "training.epochs=2")
    assert code == 0, stderr
    assert "already finished its 2 epochs; raise training.epochs (e.g. --set training.epochs=12)" in stderr
    code, stdout, stderr = run_cli(capsys, "train", blobs, "--resume", out, "--set", "training.epochs=3")
    assert code == 0 and "epoch 3 " in stdout and "epoch 2 " not in stdout, stderr


def test_resuming_a_stopped_run_with_fewer_epochs_than_it_ran_is_refused(capsys, blobs, tmp_path, monkeypatch):
    """A run set to 300 epochs by --set, stopped at 55 and resumed without the --set (the config's
    30), was told it 'had already finished its 54 epochs' and written out as done."""
    from magmadnn_cli.training.trainer import Trainer
    real = Trainer._epoch

    def stop_after_epoch_3(self, *args):
        real(self, *args)
        self.stop_requested = self.position.epoch >= 3  # as a signal caught in epoch 3 would

    monkeypatch.setattr(Trainer, "_epoch", stop_after_epoch_3)
    out = tmp_path / "stopped"
    code, _, _ = run_cli(capsys, "train", blobs, "--out", out, "-q", "--set", "training.epochs=20")
    assert code != 0 and not (out / "model.npz").exists()
    monkeypatch.setattr(Trainer, "_epoch", real)
    code, _, err = run_cli(capsys, "train", blobs, "--resume", out, "--set", "training.epochs=2")
    said = " ".join(err.split())
    assert code == 2 and "training.epochs: this config says 2, but the run was set to 20 epochs" in said, said
    assert "--set training.epochs=20" in said and not (out / "model.npz").exists()
    code, out_text, err = run_cli(capsys, "train", blobs, "--resume", out, "--set", "training.epochs=3")
    assert code == 0 and (out / "model.npz").exists(), err  # ending it where it stopped, on purpose


def test_the_json_schema_accepts_every_shipped_config_and_refuses_a_typo(capsys):
    import glob
    import json

    import jsonschema
    import yaml
    code, out, _ = run_cli(capsys, "schema")
    validator = jsonschema.Draft202012Validator(json.loads(out))
    configs = sorted(glob.glob(str(ROOT / "configs" / "*.yaml")))
    assert len(configs) >= 10
    for path in configs:
        assert not list(validator.iter_errors(yaml.safe_load(open(path)))), path
    typo = yaml.safe_load(open(configs[0])) | {"optimiser": {"type": "sgd"}}
    assert any("optimiser" in e.message for e in validator.iter_errors(typo))


def test_version_and_a_debug_flag_after_the_command(capsys, tmp_path):
    from magmadnn_cli import __version__
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"magmadnn {__version__}"
    code, out, err = run_cli(capsys, "validate", tmp_path / "missing.yaml", "--debug")
    assert code == 2 and "Traceback" in err and "config file not found" in err
    code, out, err = run_cli(capsys, "--debug", "validate", tmp_path / "missing.yaml")
    assert code == 2 and "Traceback" in err and "config file not found" in err
    code, out, err = run_cli(capsys, "validate", tmp_path / "missing.yaml")
    assert code == 2 and "Traceback" not in err


def test_json_output_is_strict_json_with_null_for_nan(capsys, blobs, tmp_path):
    import json

    from magmadnn_cli.files import to_json
    assert json.loads(to_json({"r2": float("nan"), "x": [float("inf"), 1.5]})) == {"r2": None, "x": [None, 1.5]}
    assert run_cli(capsys, "train", blobs, "--out", tmp_path / "run", "-q", "--set", "training.epochs=2")[0] == 0
    code, out, _ = run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", tmp_path / "blobs.csv", "--json")

    def refuse(word):
        raise ValueError(f"not JSON: {word}")
    assert code == 0 and json.loads(out, parse_constant=refuse)["rows"] == 120


def test_a_closed_pipe_stops_printing_not_training(blobs, tmp_path):
    """`magmadnn train ... | head -1`: the reader goes away after one line; the run still trains and
    writes its outputs. `predict ... | head` ends quietly (exit 141, as `cat` does)."""
    import subprocess
    import sys
    command = f"{sys.executable} -m magmadnn_cli train {blobs} --out {tmp_path / 'run'} --set training.epochs=40"
    result = subprocess.run(f"set -o pipefail; {command} | head -1", shell=True, executable="/bin/bash",
                            capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr
    assert result.returncode == 0 and (tmp_path / "run" / "model.npz").exists()
    rows = tmp_path / "many.csv"
    rows.write_text("f1,f2,f3,f4\n" + "1,2,3,4\n" * 200_000)
    predict = f"{sys.executable} -m magmadnn_cli predict {tmp_path / 'run' / 'model.npz'} {rows}"
    result = subprocess.run(f"set -o pipefail; {predict} | head -2", shell=True, executable="/bin/bash",
                            capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[0] == "prediction" and result.stderr == "", result.stderr
    assert result.returncode == 141


def test_help_names_only_real_commands_and_shows_flags_as_flags(capsys):
    import re
    code, out, _ = run_cli(capsys, "--help")
    named = re.findall(r"^│ ([a-z][a-z-]+)\s", out, re.M)
    assert code == 0 and {"train", "predict", "serve"} <= set(named), named
    for command in named:  # each one named is real: its help runs
        assert run_cli(capsys, command, "--help")[0] == 0, command
    code, out, _ = run_cli(capsys, "predict", "--help")
    assert "--proba" in out and "<bool>" not in out.split("--help")[0]


def test_a_cnn_output_mismatch_names_the_layer_that_sets_the_width(capsys, tmp_path):
    config = tmp_path / "cnn.yaml"
    config.write_text((ROOT / "configs" / "digits_cnn.yaml").read_text().replace(
        "../datasets/", str(ROOT / "datasets") + "/"))
    text = config.read_text()
    last_dense = text.rfind("units: 10")
    config.write_text(text[:last_dense] + "units: 7" + text[last_dense + len("units: 10"):])
    code, _, err = run_cli(capsys, "validate", config)
    assert code == 2 and ".units: the output layer has 7 units; expected 10" in err and "activation" not in err.split(":")[1]


@pytest.mark.parametrize("kind, cores, expected", [("cnn", 4, "--processes 4"), ("cnn", 1, None), ("mlp", 4, None)])
def test_a_cpu_cnn_on_one_process_is_told_the_cores_it_leaves_idle(capsys, blobs, tmp_path, monkeypatch, kind, cores,
                                                                     expected):
    """One process uses one core for everything but the GEMMs; `--processes N` trains the same steps
    ~1.5x faster on 2 cores (benchmarks/lenet_end_to_end.py), so a CPU CNN run says so; MLPs (BLAS
    already uses every core) and one-core machines are not told."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    config = ROOT / "configs" / ("digits_cnn.yaml" if kind == "cnn" else "digits_mlp.yaml")
    stdout = _train(capsys, config, tmp_path / "run", "--set", "training.epochs=1")
    said = [line for line in stdout.splitlines() if "--processes" in line]
    if expected is None:
        assert said == []
    else:
        assert len(said) == 1 and expected in said[0] and "4 cores" in said[0], stdout


def test_a_one_process_run_in_a_slurm_allocation_of_several_tasks_is_told_of_processes_auto(capsys, blobs,
                                                                                           tmp_path, monkeypatch):
    """Inside `sbatch --ntasks 2`, a plain `train` ran one process with no word (Lightning warns here)."""
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    stdout = _train(capsys, blobs, tmp_path / "run", "--set", "training.epochs=1")
    assert "this Slurm allocation has 2 tasks and this run uses one process: `--processes auto`" in stdout, stdout


def test_metrics_csv_grows_with_each_checkpoint_so_a_stopped_run_has_its_epochs(capsys, blobs, tmp_path, monkeypatch):
    """metrics.csv was written only at the end: nothing to follow (tail -f), and a run stopped or
    killed had none until resumed. Now it is rewritten with each checkpoint (every epoch by default)."""
    from conftest import ctrl_c_in_epoch
    ctrl_c_in_epoch(monkeypatch, 4)
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "run", "-q")
    assert code == 130, err
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,") and [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"], rows
    assert not (tmp_path / "run" / "metrics.json").exists()  # the end's files are the end's


def test_quiet_still_says_where_the_results_were_written(capsys, blobs, tmp_path):
    code, out, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "r", "-q")
    assert code == 0, err
    assert out.splitlines() == [f"wrote {tmp_path / 'r'}/model.npz, metrics.json, metrics.csv, config.yaml, checkpoints/"]


def test_a_run_that_writes_no_checkpoint_does_not_name_the_checkpoints_folder(capsys, blobs, tmp_path):
    code, out, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "r", "-q",
                             "--set", "training.checkpoint.every_epochs=null")
    assert code == 0, err
    assert not list((tmp_path / "r").glob("checkpoints/*.npz"))
    assert out.splitlines() == [f"wrote {tmp_path / 'r'}/model.npz, metrics.json, metrics.csv, config.yaml"]


def test_arguments_given_in_each_others_place_are_named_with_the_right_command(capsys, blobs, tmp_path):
    """A newcomer's mix-ups: a config given as the model, a CSV given as the config, a spreadsheet."""
    data = blobs.parent / "blobs.csv"
    code, _, err = run_cli(capsys, "predict", blobs, data)
    said = " ".join(err.split())
    assert code == 2 and "a YAML config, not a model file" in said and f"magmadnn train {blobs}" in said, said
    code, _, err = run_cli(capsys, "train", data)
    said = " ".join(err.split())
    assert code == 2 and "a data table, not a YAML config" in said and "data.train" in said, said
    (tmp_path / "sheet.xlsx").write_bytes(b"PK\x03\x04" + b"\0" * 40)
    code, _, err = run_cli(capsys, "predict", tmp_path / "run-missing", tmp_path / "sheet.xlsx")
    assert code == 2
    _train(capsys, blobs, tmp_path / "run", "-q", "--set", "training.epochs=1")
    code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "sheet.xlsx")
    said = " ".join(err.split())
    assert code == 2 and "a spreadsheet" in said and "save the sheet as CSV" in said, said
    code, _, err = run_cli(capsys, "predict", tmp_path / "run" / "config.yaml", data)  # a run's config: its model is beside it
    said = " ".join(err.split())
    assert code == 2 and f"the run's model is beside it: give {tmp_path / 'run' / 'model.npz'}" in said, said
    (tmp_path / "empty.yaml").write_text("\n")
    code, _, err = run_cli(capsys, "train", tmp_path / "empty.yaml")
    assert code == 2 and "received an empty file" in err and "NoneType" not in err, err
