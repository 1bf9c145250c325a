"""Model and hybrid parallelism under real ranks (`distributed.model_parallel: K`): every dense layer's
units split over K ranks, D = ranks / K data-parallel groups. The weights saved (whole) match a
one-process run: exactly in float64 (to 1e-10 after several epochs, dropout and early stopping's
restore-best included), to float32 rounding in float32; checkpoints written split resume anywhere;
each rank holds ~1/K of the dense weights; a failing rank ends the job."""

from __future__ import annotations

import time

import pytest

from conftest import (ROOT, assert_a_failing_rank_ends_the_job, assert_same_weights, find_mpiexec,
                      run_train, train_on)


MPIEXEC = find_mpiexec()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec in this environment")]
F64 = ["training.epochs=3", "precision=float64"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    root = tmp_path_factory.mktemp("model-parallel")
    return {"f64": train_on(root / "f64", F64), "f32": train_on(root / "f32", ["training.epochs=1"])}


@pytest.mark.parametrize("ranks, split", [(2, 2), (3, 3), (4, 2)], ids=["model-2", "model-3-uneven", "hybrid-2x2"])
def test_split_training_is_one_process_training(single, tmp_path, ranks, split):
    """128 and 10 units over 3 ranks split unevenly (43/43/42, 4/3/3); 4 ranks = 2 groups x 2."""
    out = train_on(tmp_path / "run", [*F64, f"distributed.model_parallel={split}"], ranks)
    assert_same_weights(out, single["f64"], 1e-10)


@pytest.mark.parametrize("optimizer", [
    "{type: lars, learning_rate: 3, weight_decay: 0.0001}",   # per-tensor norms span the split parts
    "{type: lamb, learning_rate: 0.01}",
    "{type: adam, learning_rate: 0.002, clip_norm: 0.5}",     # the whole gradient's norm, parts counted once
])
def test_norms_over_split_tensors(tmp_path, optimizer):
    overrides = ["training.epochs=2", "precision=float64", f"optimizer={optimizer}"]
    whole = train_on(tmp_path / "whole", overrides)
    split = train_on(tmp_path / "split", [*overrides, "distributed.model_parallel=2"], 2)
    assert_same_weights(split, whole, 1e-10)


def test_hybrid_with_convolutions_and_batchnorm(tmp_path):
    """resnet_small: convolutions and batchnorm replicated in each group, its dense layer split."""
    overrides = ["training.epochs=1", "precision=float64"]
    config = ROOT / "configs" / "resnet_small.yaml"
    whole = train_on(tmp_path / "whole", overrides, config=config)
    split = train_on(tmp_path / "split", [*overrides, "distributed.model_parallel=2"], 4, config=config)
    assert_same_weights(split, whole, 1e-10)


def test_float32_hybrid_agrees_to_rounding(single, tmp_path):
    out = train_on(tmp_path / "run", ["training.epochs=1", "distributed.model_parallel=2"], 4)
    assert_same_weights(out, single["f32"], 2e-5)


def test_run_log_says_the_layout_and_the_share_each_rank_holds(tmp_path):
    result = run_train(tmp_path / "run", ["training.epochs=1", "distributed.model_parallel=2"], 4, quiet=False)
    assert result.returncode == 0, result.stderr
    # digits_mlp: 61*128+128 + 128*10+10 = 9,226 parameters (3 constant pixels left out); each rank holds
    # 64 + 5 columns: 4,613
    assert "2 data-parallel groups x 2 model-parallel ranks" in result.stdout
    assert "each rank holds 4,613 of the 9,226 parameters (50%)" in result.stdout
    assert result.stdout.count("final metrics") == 1


def test_a_checkpoint_written_split_resumes_on_one_process(tmp_path):
    """The checkpoint holds whole tensors (weights and Adam's slots): a 2-way split run's epoch-1
    checkpoint continued by one process ends where the split run ended."""
    split = train_on(tmp_path / "split", ["training.epochs=2", "precision=float64", "training.early_stopping=null",
                                        "distributed.model_parallel=2", "training.checkpoint.keep=5"], 2)
    first = sorted((split / "checkpoints").glob("step*.npz"))[0]
    resumed = run_train(tmp_path / "resumed", ["training.epochs=2", "precision=float64", "training.early_stopping=null"],
                   extra=("--resume", str(first)))
    assert resumed.returncode == 0, resumed.stderr
    assert_same_weights(tmp_path / "resumed", split, 1e-10)


def test_ranks_must_be_a_multiple_of_the_split(tmp_path):
    start = time.perf_counter()
    result = run_train(tmp_path / "run", ["distributed.model_parallel=2"], 3)
    assert result.returncode == 2, result.stderr
    assert "distributed.model_parallel: 2 does not divide the 3 ranks" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run" / "model.npz").exists()


def test_one_process_runs_the_layers_whole(tmp_path):
    result = run_train(tmp_path / "run", ["training.epochs=1", "distributed.model_parallel=2"], quiet=False)
    assert result.returncode == 0, result.stderr
    assert "model_parallel: 2 needs 2 ranks or a multiple; this run has 1 process, so the layers stay whole" \
        in result.stdout + result.stderr


def test_a_failing_rank_ends_a_model_parallel_job(tmp_path):
    """Rank 1 fails while rank 0 waits in the model group's allgather: the job ends with its message."""
    assert_a_failing_rank_ends_the_job(tmp_path, (
        "import time, numpy as np\n"
        "from magmadnn_cli.distributed import get_communicator\n"
        "from magmadnn_cli.distributed.model_parallel import model_groups\n"
        "groups = model_groups(get_communicator('allreduce'), 2)\n"
        "if groups.model.rank == 1:\n"
        "    time.sleep(0.5)\n"
        "    raise RuntimeError('model rank one broke on purpose')\n"
        "groups.model.allgather_array(np.ones(3, np.float32), [3, 3])\n"), "model rank one broke on purpose")


@pytest.mark.parametrize("activation", ["softmax", "log_softmax"])
def test_a_split_layer_with_a_row_wise_activation(tmp_path, activation):
    """Softmax normalizes over the whole row: a split hidden layer applies it after the gather, not
    to each rank's slice of the units."""
    overrides = ["training.epochs=1", "precision=float64", f"model.layers.0.activation={activation}"]
    one = train_on(tmp_path / "one", overrides)
    out = train_on(tmp_path / "split", [*overrides, "distributed.model_parallel=2"], 2)
    assert_same_weights(out, one, 1e-10)
