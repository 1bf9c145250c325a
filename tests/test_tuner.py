"""Hyperparameter search: grid = Cartesian product, seeded random draws within bounds, dotted overrides
into list items, invalid trials recorded as failed, poor trials stopped early, outputs usable, and the
MPI master-worker version runs each trial exactly once with the single-process results."""

from __future__ import annotations

import csv
import re
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from magmadnn_cli.config.schema import SearchConfig
from magmadnn_cli.config.loading import load_config
from magmadnn_cli.distributed.launcher import locate_mpi_launcher
from magmadnn_cli.errors import Interrupted, MagmaError
from magmadnn_cli.commands.tune import tune
from magmadnn_cli.commands.tune.objective import objective_direction
from magmadnn_cli.commands.tune.search import Pruner
from magmadnn_cli.commands.tune.search_space import Trials
from magmadnn_cli.commands.tune.trial_config import trial_config

from conftest import run_cli

SEARCH = """
search:
  method: grid
  objective: val_accuracy
  space:
    model.layers.0.units: [4, 16]
    optimizer.learning_rate: [0.001, 0.05]
    model.layers.0.activation: [relu, tanh]
"""


def test_grid_is_the_cartesian_product():
    trials = list(Trials(SearchConfig(method="grid", space={"a": [1, 2, 3], "b": ["x", "y"], "c.0.d": [True]})))
    assert len(trials) == 6
    assert {(t["a"], t["b"]) for t in trials} == {(a, b) for a in (1, 2, 3) for b in "xy"}
    with pytest.raises(MagmaError, match="grid search needs lists"):
        Trials(SearchConfig(method="grid", space={"a": {"uniform": [0, 1]}}))


def test_random_search_is_seeded_and_in_bounds():
    space = {"lr": {"loguniform": [1e-4, 1e-1]}, "u": {"uniform": [-1, 2]}, "n": {"int_uniform": [3, 5]},
             "act": ["relu", "tanh"]}
    a = list(Trials(SearchConfig(method="random", trials=300, seed=4, space=space)))
    assert a == list(Trials(SearchConfig(method="random", trials=300, seed=4, space=space)))
    assert a != list(Trials(SearchConfig(method="random", trials=300, seed=5, space=space)))
    lr = np.array([t["lr"] for t in a])
    assert lr.min() >= 1e-4 and lr.max() <= 1e-1
    assert 0.3 < np.mean(np.log10(lr) < -2.5) < 0.7  # log-uniform: half the draws below 10^-2.5
    assert all(-1 <= t["u"] <= 2 for t in a)
    assert {t["n"] for t in a} == {3, 4, 5} and {t["act"] for t in a} == {"relu", "tanh"}


def test_dotted_overrides_reach_list_items(blobs):
    base = load_config(blobs).model_dump(mode="json")
    cfg = trial_config(base, {"model.layers.0.units": 7, "optimizer.learning_rate": 0.2})
    assert cfg.model.layers[0].units == 7 and cfg.optimizer.learning_rate == 0.2


def test_median_pruner_on_the_objectives_own_direction():
    pruner = Pruner("median", grace=2)  # a loss: lower is better
    pruner.record([1.0, 0.8, 0.6])
    pruner.record([1.2, 0.9, 0.7])
    assert not pruner(1, 9.0)  # grace epoch
    assert pruner(2, 0.95) and not pruner(2, 0.5)
    accuracy = Pruner("median", grace=2, maximize=True)
    accuracy.record([0.5, 0.7])
    accuracy.record([0.6, 0.8])
    assert accuracy(2, 0.6) and not accuracy(2, 0.9)


PRUNED_SEARCH = """
search:
  method: grid
  early_stop: median
  space:
    optimizer.learning_rate: [0.05, 0.04, 0.00001]
"""


def _search_project(blobs, extra: str = SEARCH):
    blobs.write_text(blobs.read_text() + extra)
    return load_config(blobs)


def test_search_writes_results_records_failures_and_best_config_trains(capsys, blobs, tmp_path):
    space = SEARCH + "    model.layers.1.units: [3, 5]\n"  # 5 output units for 3 classes: those trials fail
    cfg = _search_project(blobs, space)
    results = tune(cfg, tmp_path / "t")
    assert len(results) == 16
    failed = [r for r in results if r["status"] == "failed"]
    assert len(failed) == 8 and all("units" in r["reason"] for r in failed)
    rows = list(csv.DictReader((tmp_path / "t" / "trials.csv").open()))
    assert len(rows) == 16 and "param:model.layers.0.units" in rows[0]
    best = min((r for r in results if r["status"] == "ok"),
               key=lambda r: (-r["val_accuracy"], r["val_loss"], r["trial"]))  # ties: lowest val_loss, then order
    best_config = yaml.safe_load((tmp_path / "t" / "best_config.yaml").read_text())
    assert best_config["model"]["layers"][0]["units"] == best["param:model.layers.0.units"]
    assert (tmp_path / "t" / "model.npz").exists()
    code, _, err = run_cli(capsys, "train", tmp_path / "t" / "best_config.yaml", "--out", tmp_path / "b", "-q")
    assert code == 0, err


def test_poor_trials_stop_before_their_epoch_budget(blobs, tmp_path):
    cfg = _search_project(blobs, PRUNED_SEARCH)
    results = tune(cfg, tmp_path / "t")
    bad = results[2]  # a learning rate this small barely moves: worse than the median after the grace epochs
    assert bad["status"] == "pruned" and bad["epochs"] < cfg.training.epochs
    assert results[0]["epochs"] == cfg.training.epochs


def test_resume_gives_the_pruner_the_finished_curves_back(blobs, tmp_path):
    """Cut the journal after trials 0 and 1 (as a kill would): the resumed search must prune trial 2
    exactly as the whole search did, which it can only do with the first two trials' curves."""
    cfg = _search_project(blobs, PRUNED_SEARCH)
    whole = tune(cfg, tmp_path / "t")
    journal = tmp_path / "t" / "trials.jsonl"
    journal.write_text("".join(journal.read_text().splitlines(keepends=True)[:3]) + '{"trial": 2, "stat')
    resumed = tune(cfg, tmp_path / "t", resume=True)
    keep = ("trial", "status", "val_accuracy", "val_loss", "epochs")
    assert [{k: r.get(k) for k in keep} for r in resumed] == [{k: r.get(k) for k in keep} for r in whole]
    assert resumed[2]["status"] == "pruned"


def test_mpi_search_runs_every_trial_once_like_one_process(blobs, tmp_path):
    try:
        mpiexec = locate_mpi_launcher()
    except MagmaError:
        pytest.skip("no mpiexec")
    _search_project(blobs)
    single = tune(load_config(blobs), tmp_path / "one")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    result = subprocess.run([mpiexec, "-n", "3", sys.executable, "-m", "magmadnn_cli", "tune", str(blobs),
                             "--out", str(tmp_path / "mpi")], capture_output=True, stdin=subprocess.DEVNULL,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader((tmp_path / "mpi" / "trials.csv").open()))
    assert sorted(int(r["trial"]) for r in rows) == list(range(8))
    for row, one in zip(rows, single):
        assert math.isclose(float(row["val_accuracy"]), one["val_accuracy"], abs_tol=1e-6)
        assert math.isclose(float(row["val_loss"]), one["val_loss"], rel_tol=1e-5)
    # resumed under MPI from a journal holding trials 0, 2 and 5: the master hands out only the others
    journal = tmp_path / "mpi" / "trials.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    kept = [lines[0]] + [line for line in lines[1:] if json.loads(line)["trial"] in (0, 2, 5)]
    journal.write_text("".join(kept))
    resumed = subprocess.run([mpiexec, "-n", "3", sys.executable, "-m", "magmadnn_cli", "tune", str(blobs),
                              "--out", str(tmp_path / "mpi"), "--resume"], capture_output=True,
                             stdin=subprocess.DEVNULL, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming: 3 of 8 trial(s) already finished" in resumed.stdout
    assert sum(line.startswith("trial ") for line in resumed.stdout.splitlines()) == 5  # one line per trial run
    again = list(csv.DictReader((tmp_path / "mpi" / "trials.csv").open()))
    assert [(r["trial"], r["val_loss"]) for r in again] == [(r["trial"], r["val_loss"]) for r in rows]


def test_more_ranks_than_trials_does_not_hang(blobs, tmp_path):
    try:
        mpiexec = locate_mpi_launcher()
    except MagmaError:
        pytest.skip("no mpiexec")
    _search_project(blobs, "\nsearch:\n  space:\n    optimizer.learning_rate: [0.01]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    result = subprocess.run([mpiexec, "-n", "3", sys.executable, "-m", "magmadnn_cli", "tune", str(blobs), "-q",
                             "--out", str(tmp_path / "t")], capture_output=True, stdin=subprocess.DEVNULL,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(list(csv.DictReader((tmp_path / "t" / "trials.csv").open()))) == 1


def test_a_crashing_trial_is_recorded_and_the_search_goes_on(blobs, tmp_path, monkeypatch):
    import magmadnn_cli.commands.train as run_module
    real = run_module.train

    def flaky(config, *args, **kwargs):
        if config.optimizer.learning_rate == 0.05:
            raise RuntimeError("worker lost its GPU")
        return real(config, *args, **kwargs)

    monkeypatch.setattr(run_module, "train", flaky)
    cfg = _search_project(blobs, "\nsearch:\n  space:\n    optimizer.learning_rate: [0.05, 0.01]\n")
    results = tune(cfg, tmp_path / "t")
    assert results[0]["status"] == "failed" and "RuntimeError: worker lost its GPU" in results[0]["reason"]
    assert results[1]["status"] == "ok" and (tmp_path / "t" / "model.npz").exists()
    cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update={"space": {"optimizer.learning_rate": [0.05]}})})
    with pytest.raises(MagmaError, match=r"no trial finished with an objective .* \(trial 0: RuntimeError: worker lost"):
        tune(cfg, tmp_path / "all_failed")


@pytest.mark.parametrize("turned_into", [TypeError("numpy re-raised it"), MagmaError("a reader fell back")])
def test_a_stop_signal_turned_into_a_trial_error_still_stops_the_search(blobs, tmp_path, monkeypatch, turned_into):
    """numpy and pyarrow can turn the KeyboardInterrupt a signal raises into another exception; a
    trial must not record it as its own failure and let the search run on (once in the whole
    suite, a SIGTERMed search ran all 400 trials and exited 0)."""
    import signal

    import magmadnn_cli.commands.train as run_module
    from magmadnn_cli import signals

    def interrupted(config, *args, **kwargs):
        signals.record(signal.SIGTERM)  # as the handler does, before the exception is swapped
        raise turned_into

    monkeypatch.setattr(run_module, "train", interrupted)
    monkeypatch.setattr(signals, "_STOPS", signals._Stops())  # this process: no signal recorded yet
    cfg = _search_project(blobs, "\nsearch:\n  space:\n    optimizer.learning_rate: [0.05, 0.01]\n")
    with pytest.raises(Interrupted, match=r"stopped by SIGTERM after 0 of 2 trial\(s\) finished"):
        tune(cfg, tmp_path / "t")


def test_a_stop_signal_whose_exception_was_swallowed_still_stops_the_search(blobs, tmp_path, monkeypatch):
    """A signal's KeyboardInterrupt raised where Python swallows it (a __del__, a weakref or GC callback:
    'Exception ignored in ...') leaves only the record; the search stops before its next trial (once
    more in the suite, a SIGTERMed search ran all 400 trials and exited 0)."""
    import signal

    import magmadnn_cli.commands.train as run_module
    from magmadnn_cli import signals
    real, calls = run_module.train, []

    def swallowed(config, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            signals.record(signal.SIGTERM)  # the handler ran; its exception went nowhere
        return real(config, *args, **kwargs)

    monkeypatch.setattr(run_module, "train", swallowed)
    monkeypatch.setattr(signals, "_STOPS", signals._Stops())  # this process: no signal recorded yet
    cfg = _search_project(blobs, "\nsearch:\n  space:\n    optimizer.learning_rate: [0.05, 0.01, 0.005, 0.001]\n")
    with pytest.raises(Interrupted, match=r"stopped by SIGTERM after 2 of 4 trial\(s\) finished"):
        tune(cfg, tmp_path / "t")
    assert len(calls) == 2


@pytest.mark.parametrize("ranks", [0, 3])
def test_sigterm_keeps_the_finished_trials(blobs, tmp_path, ranks):
    """A search stopped by SIGTERM (a cluster's time limit) writes what its finished trials found, on
    one process and under mpiexec (which passes the signal to every rank: the workers leave it to
    the master, which writes the results and ends the job)."""
    import signal
    import time

    from conftest import find_mpiexec
    mpiexec = find_mpiexec()
    if ranks and mpiexec is None:
        pytest.skip("no mpiexec")
    config = blobs.parent / "slow.yaml"
    config.write_text(blobs.read_text().replace("epochs: 15", "epochs: 30") +
                      "search: {method: random, trials: 400, space: {optimizer.learning_rate: {loguniform: [0.001, 0.1]}}}\n")
    out = tmp_path / "search"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    prefix = [mpiexec, "-n", str(ranks)] if ranks else []
    p = subprocess.Popen([*prefix, sys.executable, "-m", "magmadnn_cli", "tune", str(config), "--out", str(out), "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    journal, deadline = out / "trials.jsonl", time.time() + 120

    def journaled() -> int:
        return len(journal.read_text().splitlines()) - 1 if journal.exists() else 0  # the header line
    while time.time() < deadline and p.poll() is None and journaled() < 3:
        time.sleep(0.02)
    assert p.poll() is None and journaled() >= 3, "the search should be running with 3 trials finished"
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, (  # what ran after the signal, for a failure's diagnosis
        f"exit {p.returncode}, {journaled()} trials journaled; stdout: {stdout[-500:]!r}; stderr: {stderr[-2000:]!r}")
    assert "stopped by SIGTERM after" in stderr and "of 400 trial(s) finished" in stderr and "Traceback" not in stderr
    assert f"Continue with: magmadnn tune {config} -q --out {out} --resume" in stderr, stderr
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert 3 <= len(rows) < 400 and all(r["status"] == "ok" for r in rows)
    assert (out / "model.npz").exists() and (out / "best_config.yaml").exists()


def test_a_killed_search_resumes_where_it_stopped(blobs, tmp_path):
    """kill -9 after a few trials; `tune --resume` runs only the rest (the median pruner gets the
    finished trials' curves back), and the table equals an uninterrupted search's."""
    import signal
    import time
    config = blobs.parent / "grid.yaml"
    config.write_text(blobs.read_text().replace("epochs: 15", "epochs: 8") + """search:
  method: grid
  early_stop: median
  space:
    optimizer.learning_rate: [0.001, 0.003, 0.01, 0.03, 0.1, 0.0003]
    model.layers.0.units: [4, 16]
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    tune_cmd = [sys.executable, "-m", "magmadnn_cli", "tune", str(config)]
    whole = subprocess.run([*tune_cmd, "-q", "--out", str(tmp_path / "whole")], capture_output=True, text=True, env=env)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "killed"
    p = subprocess.Popen([*tune_cmd, "-q", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    journal = out / "trials.jsonl"
    while p.poll() is None and not (journal.exists() and len(journal.read_text().splitlines()) >= 4):
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    finished = len(journal.read_text().splitlines()) - 1
    assert 3 <= finished < 12, "the search should have been killed midway"
    resumed = subprocess.run([*tune_cmd, "--out", str(out), "--resume"], capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: {finished} of 12 trial(s) already finished" in resumed.stdout
    assert sum(line.startswith("trial ") for line in resumed.stdout.splitlines()) == 12 - finished
    keep = ("trial", "status", "param:optimizer.learning_rate", "param:model.layers.0.units", "val_accuracy",
            "val_loss", "epochs")
    rows = lambda d: [{k: r[k] for k in keep} for r in csv.DictReader((d / "trials.csv").open())]  # noqa: E731
    assert rows(out) == rows(tmp_path / "whole")
    assert any(r["status"] == "pruned" for r in rows(out))  # the pruner really took part


def test_resume_refuses_another_search(blobs, tmp_path, capsys):
    config = blobs.parent / "s.yaml"
    config.write_text(blobs.read_text().replace("epochs: 15", "epochs: 2") +
                      "search: {space: {optimizer.learning_rate: [0.01, 0.02]}}\n")
    code, _, err = run_cli(capsys, "tune", config, "--out", tmp_path / "t", "-q")
    assert code == 0, err
    code, _, err = run_cli(capsys, "tune", config, "--out", tmp_path / "t", "-q", "--resume",
                           "--set", "search.method=random", "--set", "training.batch_size=8")
    assert code == 2 and "search.method: search 'grid', config 'random'" in err, err
    assert "training.batch_size: search 16, config 8" in err
    code, _, err = run_cli(capsys, "tune", config, "--out", tmp_path / "nothing", "-q", "--resume")
    assert code == 2 and "trials.jsonl not found" in err


def test_objective_directions_and_mixes(blobs):
    from magmadnn_cli.config.schema import SearchConfig
    assert objective_direction(SearchConfig(objective={"val_loss": 1.0})) == "minimize"
    assert objective_direction(SearchConfig(objective={"val_accuracy": 2.0})) == "maximize"
    assert objective_direction(SearchConfig(objective={"val_loss": -1.0})) == "maximize"
    with pytest.raises(Exception, match="mixes several metrics: set search.direction"):
        SearchConfig(objective={"val_accuracy": 1.0, "time": -0.01})
    assert objective_direction(SearchConfig(objective={"val_accuracy": 1.0, "time": -0.01}, direction="maximize")) \
        == "maximize"


def test_an_empty_grid_list_is_refused(capsys, blobs, tmp_path):
    blobs.write_text(blobs.read_text() + "search: {space: {optimizer.learning_rate: []}}\n")
    code, _, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t", "-q")
    assert code == 2 and "search.space.optimizer.learning_rate" in err and not (tmp_path / "t").exists()


def test_a_pruned_trial_is_never_the_best_even_with_the_best_score(blobs, tmp_path):
    """Pruning compares the objective's own metric (accuracy here: higher is better); a pruned trial
    stopped early, so its score is not comparable and it is never chosen."""
    from magmadnn_cli.commands.tune.search import write_results
    from magmadnn_cli.reporting import Reporter
    cfg = _search_project(blobs, PRUNED_SEARCH)
    results = tune(cfg, tmp_path / "t")
    pruned = [r for r in results if r["status"] == "pruned"]
    assert pruned and all(r["curve"] and len(r["curve"]) == r["epochs"] for r in results)
    pruned[0]["val_accuracy"] = 2.0  # better than any finished trial could be
    write_results(results, cfg.model_dump(mode="json"), tmp_path / "t", cfg.search, Reporter())
    best = yaml.safe_load((tmp_path / "t" / "best_config.yaml").read_text())
    assert best["optimizer"]["learning_rate"] != pruned[0]["param:optimizer.learning_rate"]


def test_trial_lines_are_short_and_readable(capsys, blobs, tmp_path):
    from magmadnn_cli.commands.tune.search import short_names
    assert short_names(["optimizer.learning_rate", "model.layers.0.units", "model.layers.1.units"]) == \
        ["learning_rate", "0.units", "1.units"]
    blobs.write_text(blobs.read_text().replace("epochs: 15", "epochs: 2") +
                     "search: {method: random, trials: 3, space: {optimizer.learning_rate: {loguniform: [0.001, 0.1]},"
                     " model.layers.0.units: [4, 8]}}\n")
    code, out, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3 and all(len(line) <= 100 for line in lines), lines
    assert re.search(r"learning_rate=0\.\d{1,4}(e-\d+)? ", lines[0] + " ") or "learning_rate=" in lines[0]
    assert all(len(value) <= 8 for value in re.findall(r"learning_rate=(\S+)", out))
    assert "learning_rate" in out and "model.laye…" not in out


def test_async_or_split_configs_are_noted_once_and_trials_run_whole(capsys, blobs, tmp_path):
    code, _, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "s", "--set", "distributed.strategy=async",
                           "--set", "search={method: random, trials: 3, space: {optimizer.learning_rate: [0.01, 0.1]}}")
    assert code == 0, err
    flat = " ".join(err.split())
    assert flat.count("distributed strategy async: each trial trains on one process") == 1
    assert "needs 2 ranks" not in flat
    assert "strategy: async" in (tmp_path / "s" / "best_config.yaml").read_text()  # the user's layout, kept


@pytest.mark.parametrize("space,says", [
    ("model.layers.0.unitz: [4, 8]", "search.space.model.layers.0.unitz = 4: model.layers.0.unitz: unknown key 'unitz'"),
    ("model.layers.7.units: [4, 8]", "search.space.model.layers.7.units = 4: model.layers.7: no list item 7 (the list "
                                     "has 2)"),
    ("optimizer.learning_rate: [0.01, -1]", "search.space.optimizer.learning_rate = -1: optimizer.learning_rate: "),
    ("optimizer.learning_rate: {uniform: [-1, 0.01]}", "search.space.optimizer.learning_rate = -1.0: "),
], ids=["key typo", "no such layer", "bad value", "bad bound"])
def test_a_bad_search_space_is_one_error_before_any_trial(capsys, blobs, tmp_path, space, says):
    """A newcomer's typo in a searched key ran every trial to the same failure (exit 0); a negative
    learning rate failed one trial and the search went on."""
    blobs.write_text(blobs.read_text() + f"\nsearch:\n  space:\n    model.layers.0.units: [4, 8]\n    {space}\n")
    code, _, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t", "-q")
    assert code == 2 and says in err, err
    assert not (tmp_path / "t").exists()
    code, _, err = run_cli(capsys, "validate", blobs)
    assert code == 2 and says in err, err


def test_a_reversed_range_is_one_problem(capsys, blobs, tmp_path):
    blobs.write_text(blobs.read_text() + "\nsearch:\n  space:\n    optimizer.learning_rate: {loguniform: [0.1, 0.001]}\n")
    code, _, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t", "-q")
    assert code == 2 and "low must not exceed high" in err and "valid list" not in err and "(1 problem)" in err, err


def test_ties_on_the_objective_are_broken_by_val_loss_and_said(capsys, blobs, tmp_path):
    """Both learning rates separate the blobs (val_accuracy 1.0); the first trial has the higher
    val_loss. The choice goes to the lower val_loss, and the tie and its rule are printed with it."""
    blobs.write_text(blobs.read_text() + "search: {method: grid, space: {optimizer.learning_rate: [0.01, 0.05]}}\n")
    code, out, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "t" / "trials.csv").open()))
    assert rows[0]["objective"] == rows[1]["objective"] == "1.0"
    assert float(rows[1]["val_loss"]) < float(rows[0]["val_loss"])
    best = yaml.safe_load((tmp_path / "t" / "best_config.yaml").read_text())
    assert best["optimizer"]["learning_rate"] == 0.05
    said = " ".join(out.split())
    assert "tie-break: 2 trials share the best objective 1; chosen by the lowest val_loss: trial 1 (val_loss " in said, out
    assert "best: trial 1 " in said


def test_the_tie_break_order():
    """Objective in its direction, then the second key (val_loss lowest for accuracy; val_accuracy
    highest for a loss objective), then trial order; a missing value ranks last."""
    from magmadnn_cli.commands.tune.objective import rank_key, tie_break
    accuracy = SearchConfig(objective="val_accuracy")
    trials = [{"trial": 0, "val_accuracy": 0.9, "val_loss": 0.2}, {"trial": 1, "val_accuracy": 0.9, "val_loss": 0.1},
              {"trial": 2, "val_accuracy": 0.9, "val_loss": 0.1}, {"trial": 3, "val_accuracy": 0.8, "val_loss": 0.01},
              {"trial": 4, "val_accuracy": 0.9, "val_loss": None}]
    ranked = sorted(trials, key=lambda r: rank_key(accuracy, r))
    assert [r["trial"] for r in ranked] == [1, 2, 0, 4, 3]
    note = tie_break(accuracy, ranked[0], trials)
    assert note.startswith("tie-break: 4 trials share the best objective 0.9; chosen by the lowest val_loss, then "
                           "trial order: trial 1 (val_loss 0.1; trial 2: 0.1, trial 0: 0.2, trial 4: none)"), note
    loss = SearchConfig(objective="val_loss")
    assert [r["trial"] for r in sorted(trials[:3], key=lambda r: rank_key(loss, r))] == [1, 2, 0]
    same_loss = [{"trial": 0, "val_accuracy": 0.5, "val_loss": 0.1}, {"trial": 1, "val_accuracy": 0.7, "val_loss": 0.1}]
    assert min(same_loss, key=lambda r: rank_key(loss, r))["trial"] == 1
    assert tie_break(accuracy, trials[3], [trials[3]]) is None
    assert "then trial order" in tie_break(accuracy, trials[1], trials[1:3])


REGRESSION = {"data.target": "f4", "model.layers.1.units": 1, "model.layers.1.activation": "linear", "loss": "mse"}


def test_a_regression_search_ranks_by_val_loss_by_default(capsys, blobs, tmp_path):
    """A newcomer's regression search ran all its trials to 'objective=nan' (the default objective
    was val_accuracy, which a regression loss does not report), then said no trial finished."""
    sets = [x for k, v in REGRESSION.items() for x in ("--set", f"{k}={v}")]
    blobs.write_text(blobs.read_text() + "search: {space: {optimizer.learning_rate: [0.001, 0.05]}}\n")
    code, out, err = run_cli(capsys, "validate", blobs, *sets)
    assert code == 0 and yaml.safe_load(out)["search"]["objective"] == "val_loss", err
    code, out, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t", "--set", "training.epochs=3", *sets)
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "t" / "trials.csv").open()))
    losses = {r["trial"]: float(r["val_loss"]) for r in rows}
    assert all(float(r["objective"]) == losses[r["trial"]] for r in rows)
    best = min(losses, key=losses.get)
    said = " ".join((out + err).split())
    assert f"best: trial {best} " in said
    assert "accuracy" not in said and "accuracy" not in rows[0], "a regression has no accuracy to show"
    assert "ties: trial order" in said


@pytest.mark.parametrize("change,says", [
    ({**REGRESSION, "search.objective": "val_accuracy"}, "search.objective: val_accuracy needs a classification loss"),
    ({"data.validation_split": 0}, "search.objective val_accuracy is measured on validation rows"),
])
def test_a_search_whose_objective_cannot_be_measured_is_refused_before_any_trial(capsys, blobs, tmp_path, change, says):
    sets = [x for k, v in change.items() for x in ("--set", f"{k}={v}")]
    blobs.write_text(blobs.read_text() + "search: {space: {optimizer.learning_rate: [0.001, 0.05]}}\n")
    code, _, err = run_cli(capsys, "tune", blobs, "--out", tmp_path / "t", "-q", *sets)
    assert code == 2 and says in " ".join(err.split()) and not (tmp_path / "t").exists(), err
    assert run_cli(capsys, "validate", blobs, *sets)[0] == 0  # train needs no search (a saved model keeps loading)
