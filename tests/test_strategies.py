"""The strategy registry (`distributed.strategies`): each entry's facts hold where they are cheap to
check on one process; the multi-rank facts are checked under mpiexec by test_mpi, test_rank_invariance,
test_async_sgd and test_model_parallel."""

from __future__ import annotations

import pytest

from magmadnn_cli.config.loading import load_config
from magmadnn_cli.distributed import SingleProcess, comm as comm_module
from magmadnn_cli.distributed.data_parallel import DataParallel
from magmadnn_cli.distributed.strategies import STRATEGIES, checked_strategy, config_problems, get_communicator
from magmadnn_cli.errors import ConfigError

from conftest import run_cli
from test_rank_invariance import STRATEGIES as RANK_INVARIANT

NAMES = sorted(STRATEGIES)


def _config(blobs, *overrides: str):
    return load_config(blobs, list(overrides))


def test_exact_strategies_are_those_the_rank_invariance_tests_cover():
    assert {s.name for s in STRATEGIES.values() if s.exact_on_any_rank_count} == set(RANK_INVARIANT)


def test_each_entry_says_what_it_is_in_one_line():
    for name, strategy in STRATEGIES.items():
        assert strategy.name == name and strategy.description and "\n" not in strategy.description
        assert bool(strategy.whole_model) == (not strategy.model_parallel), name
        assert bool(strategy.roles) == (strategy.min_ranks > 1), name


@pytest.mark.parametrize("name", NAMES)
def test_split_layers_are_refused_exactly_where_the_strategy_keeps_whole_models(blobs, name):
    problems = config_problems(_config(blobs, f"distributed.strategy={name}", "distributed.model_parallel=2"))
    assert bool(problems) == (not STRATEGIES[name].model_parallel), problems
    for path, problem in problems:
        assert path == ("distributed",) and problem.startswith(f"strategy {name} {STRATEGIES[name].whole_model}")
        assert "use strategy auto, allreduce, ring or parameter_server, or model_parallel: 1" in problem


@pytest.mark.parametrize("name", NAMES)
def test_max_staleness_is_taken_exactly_by_the_strategies_with_stale_gradients(blobs, name):
    config = _config(blobs, f"distributed.strategy={name}", "distributed.max_staleness=1")
    if STRATEGIES[name].stale_gradients:
        assert checked_strategy(config) is STRATEGIES[name]
    else:
        with pytest.raises(ConfigError, match=f"strategy is '{name}': set strategy: async, or remove max_staleness"):
            checked_strategy(config)


@pytest.mark.parametrize("name", NAMES)
def test_one_process_trains_synchronously_under_every_strategy(blobs, name):
    """On one process every strategy's wrapper is the plain one (N ranks = 1 process is trivially
    true), and a strategy that needs more ranks says so."""
    from magmadnn_cli.commands.train import build
    run = build(_config(blobs, f"distributed.strategy={name}"), SingleProcess())
    assert type(run.trainer.parallel) is DataParallel
    assert (STRATEGIES[name].too_few_ranks(1) is None) == (STRATEGIES[name].min_ranks <= 1)


def test_a_process_outside_a_launcher_is_a_single_process(monkeypatch):
    for name in NAMES:
        monkeypatch.setattr(comm_module, "_JOINED", comm_module._Joined())  # a fresh process
        assert not comm_module.has_joined()
        made = get_communicator(name)
        assert isinstance(made, SingleProcess) and comm_module.has_joined()
        assert get_communicator("allreduce") is made  # made once: later calls return it


@pytest.mark.parametrize("overrides,message", [
    (["distributed.strategy=shared_memory", "distributed.model_parallel=2"],
     "distributed: strategy shared_memory keeps one whole copy of the weights per node; model_parallel > 1 splits"),
    (["distributed.max_staleness=0"],
     "--set distributed.max_staleness=0: distributed: max_staleness bounds asynchronous SGD; strategy is 'auto'"),
])
def test_the_commands_refuse_what_the_strategy_does_not_support(capsys, blobs, overrides, message):
    for command in ("validate", "summary", "train", "tune"):
        code, _, err = run_cli(capsys, command, blobs, *[a for o in overrides for a in ("--set", o)])
        assert code == 2 and message in " ".join(err.split()), (command, err)


def test_a_search_space_that_asks_what_the_strategy_does_not_support_is_located_at_its_key(capsys, blobs):
    code, _, err = run_cli(capsys, "validate", blobs, "--set", "search={space: {distributed.max_staleness: [0, 2]}}")
    assert code == 2 and "search.space.distributed.max_staleness = 0: distributed: max_staleness bounds" in \
        " ".join(err.split()), err
