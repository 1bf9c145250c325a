"""Runs reach TensorBoard and MLflow (`tracking:`): the hand-encoded event files are read by
TensorBoard's own reader (EventAccumulator, and its protobuf classes for the bytes), their scalars are
metrics.csv's values, a resumed run never logs a (tag, step) twice, two MPI ranks write one set; an
MLflow run on a real local store holds the flattened config, the per-epoch metrics and the model file."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from magmadnn_cli.training import events
from magmadnn_cli.training.tracking import flatten

from conftest import BLOBS_CONFIG, ROOT, find_mpiexec, project, run_cli

TRACKED = BLOBS_CONFIG.replace("  epochs: 15\n", "  epochs: 5\n") + "tracking: {tensorboard: true, log_every_steps: 4}\n"
STEPS_PER_EPOCH = 6  # 96 training rows, batch 16


def _accumulator(folder: Path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def _epochs(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _raw_pairs(folder: Path) -> Counter:
    """Every (tag, step) in every events file, counted, by TensorBoard's own file loader."""
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    pairs: Counter = Counter()
    for path in sorted(folder.glob("*tfevents*")):
        for event in loader.EventFileLoader(str(path)).Load():
            pairs.update((value.tag, event.step) for value in event.summary.value)
    return pairs


def _assert_scalars_are_the_metrics(run: Path, folder: Path, every: int = 4) -> None:
    acc, rows = _accumulator(folder), _epochs(run)
    names = {"train/loss": "loss", "train/accuracy": "accuracy", "validation/loss": "val_loss",
             "validation/accuracy": "val_accuracy", "learning_rate": "lr"}
    assert set(acc.Tags()["scalars"]) == {*names, "step/loss"}
    for tag, column in names.items():
        logged = acc.Scalars(tag)
        assert [e.step for e in logged] == [int(r["epoch"]) for r in rows], tag
        np.testing.assert_array_equal([e.value for e in logged],
                                      [float(np.float32(float(r[column]))) for r in rows], err_msg=tag)
    steps = [e.step for e in acc.Scalars("step/loss")]
    assert steps == list(range(every, len(rows) * STEPS_PER_EPOCH + 1, every))
    duplicates = [pair for pair, n in _raw_pairs(folder).items() if n > 1]
    assert not duplicates, duplicates


def test_crc32c_and_messages_match_tensorboards_own():
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb
    from tensorboard.plugins.text.summary_v2 import text_pb
    assert events.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    for data in (b"", b"x", bytes(range(256)) * 5):
        assert events.masked_crc32c(data) == masked_crc32c(data)
    markdown = "```yaml\nname: é\n```"
    assert events.summary(events.text("config", markdown)) == text_pb("config", markdown).SerializeToString()
    scalar = event_pb2.Event(wall_time=1.5, step=-7, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="train/loss", simple_value=0.25)]))
    assert events.event(1.5, -7, events.summary(events.scalar("train/loss", 0.25))) == scalar.SerializeToString()
    first = event_pb2.Event(wall_time=2.0, file_version="brain.Event:2")
    assert events.event(2.0, file_version=events.FILE_VERSION) == first.SerializeToString()
    values = {"optimizer.learning_rate": 0.01, "training.epochs": 5, "loss.type": "mse", "data.stratify": False}
    mine = summary_pb2.Summary.FromString(events.summary(events.hparams(values, 12.5))).value[0]
    theirs = hparams_pb(values, start_time_secs=12.5).value[0]
    assert (mine.tag, mine.tensor, mine.metadata.plugin_data.plugin_name) == \
        (theirs.tag, theirs.tensor, theirs.metadata.plugin_data.plugin_name)
    parse = metadata.parse_session_start_info_plugin_data  # a map: its bytes' order is free, its content not
    assert parse(mine.metadata.plugin_data.content) == parse(theirs.metadata.plugin_data.content)


def test_a_tracked_run_shows_its_metrics_config_and_hyperparameters_in_tensorboard(tmp_path, capsys):
    config = project(tmp_path, TRACKED)
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run")
    assert code == 0, err
    run = tmp_path / "run"
    assert f"TensorBoard events in {run / 'tensorboard'}" in out
    _assert_scalars_are_the_metrics(run, run / "tensorboard")
    acc = _accumulator(run / "tensorboard")
    from tensorboard.plugins.hparams import metadata
    from tensorboard.util import tensor_util
    (text,) = acc.Tensors("config")
    assert text.step == 0 and acc.SummaryMetadata("config").plugin_data.plugin_name == "text"
    assert tensor_util.make_ndarray(text.tensor_proto).item().decode() == \
        f"```yaml\n{(run / 'config.yaml').read_text()}```"
    start = metadata.parse_session_start_info_plugin_data(acc.PluginTagToContent("hparams")[events.HPARAMS_TAG])
    assert start.hparams["optimizer.learning_rate"].number_value == 0.01
    assert start.hparams["model.layers.0.activation"].string_value == "relu"
    assert start.hparams["training.shuffle"].bool_value is True
    assert "data.test" not in start.hparams  # null: not a hyperparameter value TensorBoard knows


def test_a_resumed_run_logs_each_tag_and_step_once(tmp_path, capsys):
    """Checkpoints every 2 epochs: resuming a 5-epoch run to 7 epochs redoes epoch 5 from epoch 4's
    checkpoint, which the first run logged already; a record cut off by a kill is skipped."""
    config = project(tmp_path, TRACKED.replace("  batch_size: 16\n", "  batch_size: 16\n  checkpoint: {every_epochs: 2}\n"))
    run = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", run, "-q")[0] == 0
    (first,) = (run / "tensorboard").glob("*tfevents*")
    with open(first, "ab") as f:  # what a kill in the middle of a write leaves
        f.write(events.record(events.event(1.0, 5, events.summary(events.scalar("train/loss", 9.0))))[:-7])
    code, out, err = run_cli(capsys, "train", config, "--resume", run, "--set", "training.epochs=7")
    assert code == 0, err
    assert "resuming from" in out and "epoch 5, step 0" in out
    assert len(list((run / "tensorboard").glob("*tfevents*"))) == 2
    assert len(_epochs(run)) == 7
    _assert_scalars_are_the_metrics(run, run / "tensorboard")


def test_a_fresh_run_replaces_the_event_files_of_the_run_it_replaces(tmp_path, capsys):
    config = project(tmp_path, TRACKED.replace("tensorboard: true", "tensorboard: logs/tb"))
    run = tmp_path / "run"
    assert run_cli(capsys, "train", config, "--out", run, "-q")[0] == 0
    (run / "logs" / "tb" / "notes.txt").write_text("the user's own file")
    code, out, err = run_cli(capsys, "train", config, "--out", run, "--overwrite")
    assert code == 0, err
    assert f"removed 1 TensorBoard event file(s) of an earlier run in {run / 'logs' / 'tb'}" in out
    assert sorted(p.name for p in (run / "logs" / "tb").iterdir())[-1] == "notes.txt"
    assert len(list((run / "logs" / "tb").glob("*tfevents*"))) == 1
    _assert_scalars_are_the_metrics(run, run / "logs" / "tb")


def test_a_shared_folder_keeps_every_runs_events_in_a_subfolder_per_run(tmp_path, capsys):
    """A second run into one --logdir removed the first run's event files (a newcomer lost runA's
    curves): a folder outside the run folder is shared, and each run writes <folder>/<run folder name>,
    as Lightning's versions; only the run that replaces a run replaces its events."""
    config = project(tmp_path, TRACKED.replace("tensorboard: true", f"tensorboard: {tmp_path / 'tb'}"))
    for name in ("a", "b"):
        assert run_cli(capsys, "train", config, "--out", tmp_path / name, "-q")[0] == 0
    (tmp_path / "elsewhere").mkdir()
    assert run_cli(capsys, "train", config, "--out", tmp_path / "elsewhere" / "a", "-q")[0] == 0  # a's name again
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["a", "a-2", "b"]
    for run, logs in (("a", "a"), ("b", "b"), ("elsewhere/a", "a-2")):
        _assert_scalars_are_the_metrics(tmp_path / run, tmp_path / "tb" / logs)
    code, out, _ = run_cli(capsys, "train", config, "--out", tmp_path / "b", "--overwrite")
    assert code == 0 and f"removed 1 TensorBoard event file(s) of an earlier run in {tmp_path / 'tb' / 'b'}" in out
    assert len(list((tmp_path / "tb" / "a").glob("*tfevents*"))) == 1  # a's events are a's
    _assert_scalars_are_the_metrics(tmp_path / "b", tmp_path / "tb" / "b")


@pytest.mark.mpi
@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec in this environment")
def test_two_ranks_write_one_set_of_events(tmp_path):
    pytest.importorskip("tensorboard")
    config = project(tmp_path, TRACKED)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    result = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "magmadnn_cli", "train", str(config),
                             "--out", str(tmp_path / "run"), "-q"], capture_output=True, text=True, env=env,
                            stdin=subprocess.DEVNULL, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "run" / "tensorboard").iterdir())) == 1
    _assert_scalars_are_the_metrics(tmp_path / "run", tmp_path / "run" / "tensorboard")


def test_the_config_is_flattened_to_dotted_keys():
    assert flatten({"a": {"b": 1, "c": [{"d": None}, 2]}, "e": [], "f": {}}) == \
        {"a.b": 1, "a.c.0.d": None, "a.c.1": 2, "e": "[]", "f": "{}"}


@pytest.mark.parametrize("setting,message", [
    ("tracking.tensorbord=true", "tracking.tensorbord"),
    ("tracking.log_every_steps=0", "tracking.log_every_steps"),
    ("tracking.mlflow={uri: x}", "tracking.mlflow.uri"),
])
def test_tracking_mistakes_are_located(tmp_path, capsys, setting, message):
    code, _, err = run_cli(capsys, "validate", project(tmp_path), "--set", setting)
    assert code == 2 and message in err, err


# -- MLflow ----------------------------------------------------------------------------------------
MISSING_MLFLOW = ("import sys\nsys.modules['mlflow'] = None  # as if it were not installed\n"
                  "from magmadnn_cli.__main__ import main\nsys.argv = ['magmadnn', *sys.argv[1:]]\nmain()\n")


@pytest.mark.parametrize("command", ["train", "validate"])
def test_mlflow_configured_but_not_installed_names_the_extra(tmp_path, command):
    config = project(tmp_path, TRACKED.replace("tensorboard: true", "mlflow: {tracking_uri: 'file:/x'}"))
    args = [command, str(config), *(["--out", str(tmp_path / "run"), "-q"] if command == "train" else [])]
    result = subprocess.run([sys.executable, "-c", MISSING_MLFLOW, *args], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert "tracking.mlflow: MLflow is not installed" in result.stderr
    assert "pip install 'magmadnn-cli[mlflow]'" in " ".join(result.stderr.split())
    assert not (tmp_path / "run" / "model.npz").exists()


def test_mlflow_needs_a_tracking_uri(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = project(tmp_path, TRACKED.replace("tensorboard: true", "mlflow: true"))
    code, _, err = run_cli(capsys, "validate", config)
    assert code == 2 and "no tracking_uri and MLFLOW_TRACKING_URI is not set" in " ".join(err.split()), err


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A real local MLflow store (a file: URI; MLflow 3 asks for MLFLOW_ALLOW_FILE_STORE to use one)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return f"file:{tmp_path / 'mlruns'}"


def _mlflow_config(tmp_path: Path, uri: str | None) -> Path:
    spec = f"{{tracking_uri: '{uri}', experiment: blob-runs}}" if uri else "{experiment: blob-runs}"
    return project(tmp_path, TRACKED.replace("tensorboard: true", f"tensorboard: true, mlflow: {spec}")
                   .replace("  batch_size: 16\n", "  batch_size: 16\n  checkpoint: {every_epochs: 2}\n"))


def _assert_mlflow_run(client, run_id: str, run: Path, every: int = 4) -> None:
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == run.name
    assert logged.data.params["optimizer.learning_rate"] == "0.01"
    assert logged.data.params["model.layers.1.activation"] == "softmax"
    assert logged.data.params["data.test"] == "null"
    rows = _epochs(run)
    for key, column in {"train/loss": "loss", "validation/accuracy": "val_accuracy", "learning_rate": "lr"}.items():
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == [int(r["epoch"]) for r in rows], key
        assert [m.value for m in history] == [float(r[column]) for r in rows], key
    steps = [m.step for m in client.get_metric_history(run_id, "step/loss")]
    assert sorted(steps) == list(range(every, len(rows) * STEPS_PER_EPOCH + 1, every))
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"model.npz", "config.yaml", "metrics.csv", "metrics.json"} <= artifacts
    local = Path(client.download_artifacts(run_id, "model.npz", str(run.parent / "downloaded")))
    assert local.read_bytes() == (run / "model.npz").read_bytes()


def _trained_and_checked(tmp_path, capsys, store: str, config_uri: str | None):
    """Train the blobs into an MLflow store; its one run, checked against the run folder."""
    from mlflow.tracking import MlflowClient
    config, run = _mlflow_config(tmp_path, config_uri), tmp_path / "run"
    code, _, err = run_cli(capsys, "train", config, "--out", run, "-q")
    assert code == 0, err
    client = MlflowClient(tracking_uri=store)
    (only,) = client.search_runs([client.get_experiment_by_name("blob-runs").experiment_id])
    _assert_mlflow_run(client, only.info.run_id, run)
    return client, only, config, run


def test_an_mlflow_run_holds_the_config_metrics_and_model_and_a_resume_continues_it(tmp_path, capsys, mlflow_store):
    client, only, config, run = _trained_and_checked(tmp_path, capsys, mlflow_store, mlflow_store)
    code, _, err = run_cli(capsys, "train", config, "--resume", run, "-q", "--set", "training.epochs=7")
    assert code == 0, err
    (again,) = client.search_runs([client.get_experiment_by_name("blob-runs").experiment_id])
    assert again.info.run_id == only.info.run_id
    _assert_mlflow_run(client, only.info.run_id, run)  # epoch 5 redone from epoch 4's checkpoint, logged once


def test_mlflow_takes_the_tracking_uri_from_the_environment(tmp_path, capsys, mlflow_store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store)
    _trained_and_checked(tmp_path, capsys, mlflow_store, None)


# -- issue 44, item 5: tracking never deletes, never hangs -------------------------------------------
def test_two_runs_of_one_name_starting_together_keep_their_own_events(tmp_path):
    """Two runs of the same folder name (a/x and b/x) into one shared TensorBoard folder, both started
    before either wrote: the second took the first's subfolder and deleted its events."""
    from magmadnn_cli.config.loading import load_config
    from magmadnn_cli.reporting import Reporter
    from magmadnn_cli.training.tracking import trackers
    config = load_config(project(tmp_path, TRACKED.replace("tensorboard: true", f"tensorboard: {tmp_path / 'tb'}")))
    (first,), (second,) = (trackers(config, tmp_path / run / "x", False, Reporter()) for run in ("a", "b"))
    for tracker, loss in ((first, 1.0), (second, 2.0)):
        tracker.begin({"seed": 1}, "name: x\n")
        tracker.log(1, {"train/loss": loss})
        tracker.sync()
    for tracker in (first, second):
        tracker.end("FINISHED", None)
    logged = {}
    for sub in sorted((tmp_path / "tb").iterdir()):
        acc = _accumulator(sub)
        logged[sub.name] = [e.value for e in acc.Scalars("train/loss")]
        assert (sub / ".magmadnn-run").read_text() in (str(tmp_path / "a" / "x"), str(tmp_path / "b" / "x"))
    assert sorted(logged.values()) == [[1.0], [2.0]], logged


@pytest.fixture
def silent_server():
    """A local socket that accepts connections and never answers (an MLflow server that hangs)."""
    import socket
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stop = [], threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_an_mlflow_server_that_does_not_answer_is_one_warning_and_the_run_goes_on(tmp_path, capsys, silent_server):
    pytest.importorskip("mlflow")
    import time
    config = project(tmp_path, TRACKED.replace("tensorboard: true", f"mlflow: {{tracking_uri: '{silent_server}'}}"))
    started = time.monotonic()
    code, out, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")
    seconds = time.monotonic() - started
    assert code == 0, err
    assert (tmp_path / "run" / "model.npz").is_file()
    warnings = [line for line in err.splitlines() if line.startswith("warning:") and "mlflow" in line.lower()]
    assert len(warnings) == 1 and silent_server in warnings[0], err
    assert seconds < 20, seconds  # the warning within 10 s, the 5 short epochs besides
