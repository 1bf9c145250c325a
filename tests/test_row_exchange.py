"""The shared_memory strategy's dense row exchange (distributed/row_exchange.py): each rank computes
its share of a dense layer's weight gradient x^T dz from every node-local rank's rows.

References: numpy's own x^T dz for the share arithmetic; one process's float64 run for the trained
weights (2 and 3 ranks, an uneven last batch, gradient accumulation, two "nodes"); the same 2-rank
run uninterrupted for resume (bit-identical)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import assert_same_weights, find_mpiexec, saved_weights, train_on
from magmadnn_cli.distributed.row_exchange import product_range
from magmadnn_cli.distributed.shared import _complement

# 610 rows: 488 train rows, batches of 20 with a last one of 8 (3 ranks: 3, 3 and 2 rows). The first
# dense layer is exchanged (20 rows x (48 + 64) <= 48 x 64 floats); the output layer is not.
CONFIG = """\
name: exchange
seed: 3
device: cpu
precision: float64
data:
  synthetic: {samples: 610, features: 48, classes: 3}
  validation_split: 0.2
model:
  layers:
    - {type: dense, units: 64, activation: tanh}
    - {type: dropout, rate: 0.2}
    - {type: dense, units: 3, activation: softmax}
loss: cross_entropy
optimizer: {type: sgd, learning_rate: 0.05, momentum: 0.9}
training:
  epochs: 3
  batch_size: 20
"""
EXCHANGED = {"dense_0": 3 * 25, "dense_2": 0}  # steps per layer over 3 epochs of 25 batches


@pytest.mark.parametrize("lo,hi", [(0, 35), (3, 5), (5, 7), (7, 28), (0, 7), (14, 21), (13, 14), (34, 35), (6, 22)])
def test_a_share_of_the_weight_gradient_is_numpys_product_there(lo, hi):
    rng = np.random.default_rng(lo * 100 + hi)
    x, dz = rng.standard_normal((11, 5)), rng.standard_normal((11, 7))
    out = np.full(35, np.nan)
    product_range(x, dz, out, lo, hi)
    np.testing.assert_allclose(out[lo:hi], (x.T @ dz).ravel()[lo:hi], rtol=1e-13, atol=1e-13)
    assert np.isnan(out[:lo]).all() and np.isnan(out[hi:]).all()  # nothing outside the share is written


def test_the_summed_parts_are_the_share_outside_the_computed_ranges():
    assert _complement(slice(10, 50), [(10, 20), (30, 40)]) == [(20, 30), (40, 50)]
    assert _complement(slice(10, 50), []) == [(10, 50)]
    assert _complement(slice(10, 50), [(10, 50)]) == []
    assert _complement(slice(10, 50), [(15, 50)]) == [(10, 15)]


needs_mpi = pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec in this environment")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("exchange")
    (root / "c.yaml").write_text(CONFIG)
    train_on(root / "single", [], config=root / "c.yaml")
    return root


def _metrics(run) -> dict:
    return json.loads((run / "metrics.json").read_text())


TWO_NODES = {"MAGMADNN_RANKS_PER_NODE": "2"}


@needs_mpi
@pytest.mark.parametrize("ranks,overrides,env,exchanged", [
    (2, [], {}, EXCHANGED),
    (3, [], {}, EXCHANGED),  # uneven rows, and shares that start and end inside a kernel row
    # two backward passes a step: each rank's own gradients, as without the exchange, but for the
    # epochs' last updates, of 8 rows in one pass
    (2, ["training.batch_size=10", "training.gradient_accumulation_steps=2"], {}, {"dense_0": 3, "dense_2": 0}),
    (4, [], TWO_NODES, EXCHANGED),  # two "nodes": each node's rows, then summed across
    # batches of 54 = 14 + 14 | 13 + 13 rows: too many to exchange on the first node (28 x 112 > 48 x 64),
    # not on the second; on both, the epochs' last batches (2 rows: every dense layer)
    (4, ["training.batch_size=54"], TWO_NODES, {"dense_0": 3, "dense_2": 3}),
], ids=["2-ranks", "3-ranks", "accumulation", "two-nodes", "two-nodes-disagree"])
def test_ranks_exchanging_rows_train_one_process_weights(project, tmp_path, ranks, overrides, env, exchanged):
    reference = project / "single"
    if overrides[-1:] == ["training.batch_size=54"]:
        reference = train_on(tmp_path / "single", overrides, config=project / "c.yaml")
    run = train_on(tmp_path / "run", ["distributed.strategy=shared_memory", *overrides], ranks,
                   config=project / "c.yaml", extra_env=env)
    assert _metrics(run)["dense_gradients_from_node_rows"] == exchanged  # the first node's count
    assert_same_weights(run, reference, 1e-10)


@needs_mpi
def test_resume_with_exchanged_rows_is_bit_identical(project, tmp_path):
    """One epoch, then `--resume` to the config's three, ends bitwise where three epochs end: the
    first step after the resume packs the rows as an uninterrupted run does."""
    config = project / "c.yaml"
    whole = train_on(tmp_path / "whole", [], 2, config=config)
    part = train_on(tmp_path / "part", ["training.epochs=1"], 2, config=config)
    train_on(part, [], 2, config=config, extra=("--resume", str(part)))
    got, want = saved_weights(part), saved_weights(whole)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
