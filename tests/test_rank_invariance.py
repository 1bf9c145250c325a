"""N ranks = 1 process, with stochastic and batch-coupled layers: the shipped digits_mlp (dropout)
and resnet_small (batchnorm) configs under mpiexec -n 2 and -n 3, every strategy, end with the
weights AND buffers of a one-process run. Dropout masks are keyed by the sample's position, and
batchnorm uses the global batch's statistics.

float64 runs show the algorithm is exact (to 1e-10 after several epochs); float32 runs agree to
float32 rounding (which adaptive optimizers amplify over many steps, so they run a single epoch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, assert_same_weights, find_mpiexec, saved_weights, train_on


MPIEXEC = find_mpiexec()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec in this environment")]
STRATEGIES = ["auto", "allreduce", "ring", "parameter_server", "shared_memory"]
# (config, overrides, tolerance): float64 cases over several epochs, float32 over one
CASES = {
    "digits_mlp-f64": ("digits_mlp", ["training.epochs=3", "precision=float64"], 1e-10),
    "digits_mlp-f32": ("digits_mlp", ["training.epochs=1"], 2e-5),
    "resnet_small-f64": ("resnet_small", ["training.epochs=2", "precision=float64"], 1e-10),
    "resnet_small-f32": ("resnet_small", ["training.epochs=1"], 2e-5),
    # 1258 training rows, batch 157: the last batch has 2 rows, so on 3 ranks one rank has none
    # and must still join batchnorm's reductions (no hang, same result)
    "resnet_small-empty-rank": ("resnet_small", ["training.epochs=1", "precision=float64",
                                                 "training.batch_size=157"], 1e-10),
}


def _train(out: Path, config: str, overrides: list[str], ranks: int = 0, strategy: str = "auto") -> Path:
    return train_on(out, [*overrides, f"distributed.strategy={strategy}", "training.checkpoint=false"], ranks,
                    config=ROOT / "configs" / f"{config}.yaml")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    root = tmp_path_factory.mktemp("invariance")
    return {case: _train(root / case, config, overrides) for case, (config, overrides, _) in CASES.items()}


def _assert_same_state(run: Path, reference: Path, tolerance: float) -> None:
    assert any("running_mean" in k for k in saved_weights(reference)) or "digits_mlp" in str(reference)
    assert_same_weights(run, reference, tolerance)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", ["digits_mlp-f64", "resnet_small-f64"])
def test_every_strategy_on_two_and_three_ranks_is_one_process(single, tmp_path, case, strategy):
    config, overrides, tolerance = CASES[case]
    for ranks in (2, 3):
        run = _train(tmp_path / f"{ranks}", config, overrides, ranks, strategy)
        _assert_same_state(run, single[case], tolerance)


@pytest.mark.parametrize("case", ["digits_mlp-f32", "resnet_small-f32", "resnet_small-empty-rank"])
def test_float32_and_an_empty_rank(single, tmp_path, case):
    config, overrides, tolerance = CASES[case]
    for ranks in (2, 3):
        run = _train(tmp_path / f"{ranks}", config, overrides, ranks)
        _assert_same_state(run, single[case], tolerance)


def test_per_rank_batch_statistics_are_an_explicit_opt_out(single, tmp_path):
    """distributed.sync_batchnorm: false breaks rank invariance (as documented) but every rank still
    saves and evaluates one agreed model (the running statistics are averaged each epoch)."""
    config, overrides, tolerance = CASES["resnet_small-f64"]
    run = _train(tmp_path / "local", config, [*overrides, "distributed.sync_batchnorm=false"], ranks=2)
    got, want = saved_weights(run), saved_weights(single["resnet_small-f64"])
    assert max(np.abs(got[k] - want[k]).max() for k in want) > 1e-6
