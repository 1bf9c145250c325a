"""A search is sized by arithmetic and its trials generated lazily: a space too large to run is refused
before anything is allocated (under a 1 GiB address-space cap), one that fits never materializes its
trials; cross-validation needs a row per fold."""

from __future__ import annotations

import itertools
import resource
import subprocess
import sys
import tracemalloc

import pytest

from magmadnn_cli.commands.tune.search_space import MAX_TRIALS, Trials
from magmadnn_cli.config.schema import SearchConfig
from magmadnn_cli.errors import MagmaError

from conftest import ROOT, project, run_cli

TEN = ", ".join(str(v) for v in range(1, 11))
TENTHS = ", ".join(f"0.{v}" for v in range(10))
TWELVE_KEYS = "\n".join(f"    optimizer.{key}: [{TENTHS if key.startswith('beta') else TEN}]" for key in (
    "learning_rate", "weight_decay", "clip_norm", "beta1", "beta2", "epsilon")) + "\n" + "\n".join(
    f"    model.layers.{i}.units: [{', '.join(str(v) for v in range(1, 11))}]" for i in range(6))


def _capped(*args: str, cap: int = 2**30) -> subprocess.CompletedProcess:
    """The CLI under an address-space limit (RLIMIT_AS), as a user's cluster job might run it."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return subprocess.run([sys.executable, "-m", "magmadnn_cli", *args], capture_output=True, text=True,
                          preexec_fn=limit, cwd=ROOT, timeout=120)


def _search_config(tmp_path, search: str):
    layers = "\n".join("    - {type: dense, units: 4, activation: relu}" for _ in range(6))
    text = (f"name: big\nseed: 0\ndata: {{train: blobs.csv, target: label}}\nmodel:\n  layers:\n{layers}\n"
            "    - {type: dense, units: 3, activation: softmax}\nloss: cross_entropy\noptimizer: {type: adam}\n"
            f"training: {{epochs: 1}}\nsearch:\n{search}")
    return project(tmp_path, text)


def test_a_grid_of_ten_to_the_twelve_points_is_refused_before_anything_runs(tmp_path):
    config = _search_config(tmp_path, f"  method: grid\n  space:\n{TWELVE_KEYS}\n")
    for command in (("tune", str(config), "--out", str(tmp_path / "out")), ("validate", str(config))):
        done = _capped(*command)
        assert done.returncode == 2, done.stderr
        assert "the grid has 1,000,000,000,000 points (10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10" \
               " values); the limit is 1,000,000 trials" in done.stderr
        assert "MemoryError" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_trillion_random_trials_are_refused_by_name(tmp_path):
    config = _search_config(tmp_path, "  method: random\n  trials: 1000000000000\n  space:\n"
                                      "    optimizer.learning_rate: {loguniform: [0.001, 0.1]}\n")
    done = _capped("tune", str(config), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "search.trials: 1,000,000,000,000 random trials; the limit is 1,000,000" \
        in done.stderr, done.stderr


def test_trials_are_sized_by_arithmetic_and_generated_lazily():
    space = {f"k{i}": list(range(10)) for i in range(6)}  # a million points: at the limit
    tracemalloc.start()
    trials = Trials(SearchConfig(method="grid", space=space))
    first = list(itertools.islice(trials, 3))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(trials) == MAX_TRIALS and peak < 1_000_000  # a materialized grid: hundreds of MB
    assert first == [{**{f"k{i}": 0 for i in range(5)}, "k5": v} for v in range(3)]  # the last key fastest
    pending = Trials(SearchConfig(method="random", trials=5, seed=3, space={"a": {"uniform": [0, 1]}}))
    everything = list(pending)
    assert list(pending.pending({0, 2})) == [(1, everything[1]), (3, everything[3]), (4, everything[4])]
    with pytest.raises(MagmaError, match="the grid has 10,000,000 points"):
        Trials(SearchConfig(method="grid", space={**space, "k6": list(range(10))}))


def test_more_folds_than_rows_is_a_clear_error(capsys, tmp_path):
    config = project(tmp_path)
    (tmp_path / "few.csv").write_text("f1,f2,f3,f4,label\n" + "".join(f"{i},{i % 3},1,2,{'ab'[i % 2]}\n"
                                                                      for i in range(8)))
    text = config.read_text().replace("blobs.csv", "few.csv").replace("units: 3,", "units: 2,")
    config.write_text(text)
    code, _, err = run_cli(capsys, "train", config, "--folds", "20", "--out", tmp_path / "cv")
    assert code == 2 and "20 folds:" in err and "has 8 rows" in err and "use at most 8 folds" in err, err
    assert "KeyError" not in err
    config.write_text(text + "search:\n  folds: 10\n  space: {optimizer.learning_rate: [0.01]}\n")
    code, _, err = run_cli(capsys, "tune", config, "--out", tmp_path / "t")
    assert "KeyError" not in err and "10 folds:" in err and "use at most 8 folds" in err, err
