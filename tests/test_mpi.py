"""Real ranks under mpiexec: rank-count invariance for every strategy, one set of outputs, --processes,
a failing rank ends the whole job promptly with its message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import assert_a_failing_rank_ends_the_job, assert_sigterm_to_the_launcher_stops_the_job, find_mpiexec


MPIEXEC = find_mpiexec()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec in this environment")]

CONFIG = """\
name: syn
seed: 3
device: cpu
data:
  synthetic: {samples: 203, features: 10, classes: 3}
  validation_split: 0.1
model:
  layers:
    - {type: dense, units: 16, activation: tanh}
    - {type: dense, units: 3, activation: softmax}
loss: cross_entropy
optimizer: {type: sgd, learning_rate: 0.1, momentum: 0.9}
training: {epochs: 3, batch_size: 32}
"""


def _magmadnn(*args: str, ranks: int = 0, timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))} | extra_env
    prefix = [str(MPIEXEC), "-n", str(ranks)] if ranks else []
    return subprocess.run([*prefix, sys.executable, "-m", "magmadnn_cli", *args], capture_output=True,
                          stdin=subprocess.DEVNULL, text=True, env=env, timeout=timeout)


def _weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / "model.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files if k.startswith("weights/")}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("mpi")
    (root / "syn.yaml").write_text(CONFIG)
    single = _magmadnn("train", str(root / "syn.yaml"), "--out", str(root / "single"), "-q")
    assert single.returncode == 0, single.stderr
    return root


@pytest.mark.parametrize("strategy", ["auto", "allreduce", "ring", "parameter_server", "shared_memory"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_weights_match_a_single_process_run(project, strategy, ranks):
    out = project / f"{strategy}-{ranks}"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), "-q",
                       "--set", f"distributed.strategy={strategy}", ranks=ranks)
    assert result.returncode == 0, result.stderr
    single, multi = _weights(project / "single"), _weights(out)
    assert single.keys() == multi.keys()
    for key in single:  # 203 rows, batch 32: the short last batch is split unevenly, still exact
        np.testing.assert_allclose(multi[key], single[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_only_rank_zero_reports_and_writes(project):
    out = project / "quiet-check"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), ranks=3)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("final metrics") == 1 and result.stdout.count("epoch 3 ") == 1
    assert "3 process(es)" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == [".magmadnn", "checkpoints", "config.yaml", "metrics.csv",
                                                     "metrics.json", "model.npz"]
    assert len(list((out / "checkpoints").iterdir())) == 2  # one writer: the newest 2, no temp files


def test_processes_option_launches_itself(project):
    out = project / "launched"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), "-q", "--processes", "2")
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(_weights(out)["weights/dense_0/kernel"],
                               _weights(project / "single")["weights/dense_0/kernel"], rtol=1e-5, atol=1e-6)


def test_a_launch_whose_output_reader_goes_away_still_finishes(project):
    """`magmadnn train ... --processes 2 | head -1`: the reader closes the pipe while the ranks still
    print; the run goes on to its model and exit 0, as one process does (was: mpiexec died of SIGPIPE,
    killing the ranks and leaving a folder holding only a dead lock)."""
    out = project / "headed"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    job = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", "train", str(project / "syn.yaml"), "--out", str(out),
                            "--processes", "2", "--set", "training.epochs=40"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    assert job.stdout.readline()  # the first line (as `head -1` reads it), then the reader goes
    job.stdout.close()
    assert job.wait(timeout=120) == 0
    assert (out / "model.npz").is_file() and not (out / ".magmadnn.lock").exists()


def test_a_failing_rank_aborts_the_job_promptly(tmp_path):
    assert_a_failing_rank_ends_the_job(tmp_path, (
        "import time\n"
        "from magmadnn_cli.distributed import get_communicator\n"
        "comm = get_communicator()\n"
        "if comm.rank == 1:\n"
        "    time.sleep(0.5)\n"
        "    raise RuntimeError('rank one broke on purpose')\n"
        "comm.barrier()  # rank 0 would wait here forever without the abort\n"), "rank one broke on purpose")


def test_the_message_before_an_abort_reaches_the_user(tmp_path):
    """MPI_Abort ends the job at once; the launcher used to drop what the rank had just printed
    (15 of 80 runs here lost it). The abort now waits until the launcher has read the output."""
    script = tmp_path / "abort.py"
    script.write_text(
        "import sys\n"
        "from magmadnn_cli.distributed import get_communicator\n"
        "comm = get_communicator()\n"
        "if comm.rank == 0:\n"
        "    print('error: the last words ' + 'x' * 2000, file=sys.stderr)\n"
        "    comm.abort(2)\n"
        "comm.barrier()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    lost = 0
    for _ in range(20):
        result = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(script)], capture_output=True,
                                stdin=subprocess.DEVNULL, text=True, env=env, timeout=60)
        assert result.returncode == 2
        lost += "error: the last words " + "x" * 2000 not in result.stderr
    assert lost == 0, f"the message was lost in {lost} of 20 aborts"


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_user_error_under_mpi_is_said_once_and_leaves_nothing(project, tmp_path, ranks):
    """A mistake every rank finds in the data (here: the output width) is one message, exit 2, with
    no MPI abort noise and no run folder (nor its lock) left behind."""
    out = tmp_path / "runs" / "x"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), "--set", "model.layers.1.units=4",
                       ranks=ranks)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("the output layer has 4 units; expected 3") == 1, result.stderr
    assert "rank " not in result.stderr and "Abort" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_drawn_seed_is_one_seed_for_all_ranks(project):
    """No seed in the config: rank 0 draws it for every rank (else ranks would split the data
    differently). The recorded seed reproduces the run on one process."""
    out = project / "no-seed"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), "-q", "--set", "seed=null", ranks=2)
    assert result.returncode == 0, result.stderr
    seed = yaml.safe_load((out / "config.yaml").read_text())["seed"]
    again = _magmadnn("train", str(project / "syn.yaml"), "--out", str(project / "seeded"), "-q", "--set", f"seed={seed}")
    assert again.returncode == 0, again.stderr
    multi, single = _weights(out), _weights(project / "seeded")
    for key in single:
        np.testing.assert_allclose(multi[key], single[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("ranks", [2, 3])
def test_shared_memory_splits_a_clipped_adam_update_exactly(project, ranks):
    """Each rank updates its share of the shared weights and Adam state; the clipping norm is summed
    over the shares. The result is the 1-process run's."""
    adam = ("--set", "optimizer={type: adam, learning_rate: 0.01, clip_norm: 0.05}")
    single = _magmadnn("train", str(project / "syn.yaml"), "--out", str(project / "adam-1"), "-q", "--overwrite", *adam)
    assert single.returncode == 0, single.stderr
    out = project / f"adam-shm-{ranks}"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), "-q", *adam,
                       "--set", "distributed.strategy=shared_memory", ranks=ranks)
    assert result.returncode == 0, result.stderr
    want, got = _weights(project / "adam-1"), _weights(out)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("optimizer", ["{type: lars, learning_rate: 1.0, weight_decay: 0.001}",
                                       "{type: lamb, learning_rate: 0.01, clip_norm: 0.05}"])
def test_shared_memory_splits_a_layerwise_update_exactly(project, optimizer):
    """LARS and LAMB scale each tensor's step by a ratio of norms over the whole tensor, while the 2
    ranks each update half of the buffers (the cut runs through the first kernel): the partial norms
    are summed over the ranks. The result is the 1-process run's."""
    name = optimizer.split(",")[0].split()[-1]
    args = ("--set", f"optimizer={optimizer}")
    single = _magmadnn("train", str(project / "syn.yaml"), "--out", str(project / f"{name}-1"), "-q", *args)
    assert single.returncode == 0, single.stderr
    out = project / f"{name}-shm-2"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), "-q", *args,
                       "--set", "distributed.strategy=shared_memory", ranks=2)
    assert result.returncode == 0, result.stderr
    want, got = _weights(project / f"{name}-1"), _weights(out)
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("strategy", ["shared_memory", "auto"])
def test_shared_memory_across_nodes(project, strategy):
    """4 ranks as 2 "nodes" of 2: shares are summed in each node, then allreduced between the ranks
    holding the same share on the two nodes (shared_memory), or plain MPI (auto, several nodes)."""
    out = project / f"nodes-{strategy}"
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(out), "-q",
                       "--set", f"distributed.strategy={strategy}", ranks=4, MAGMADNN_RANKS_PER_NODE="2")
    assert result.returncode == 0, result.stderr
    single, multi = _weights(project / "single"), _weights(out)
    for key in single:
        np.testing.assert_allclose(multi[key], single[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_shared_memory_needs_room_in_dev_shm(tmp_path):
    from magmadnn_cli.distributed.comm import shared_memory_fits
    assert shared_memory_fits(1, str(tmp_path)) and not shared_memory_fits(2**62, str(tmp_path))
    assert shared_memory_fits(2**62, str(tmp_path / "missing"))  # nothing to ask: MPI decides


def test_sigterm_to_the_launcher_reaches_every_rank_and_leaves_no_orphan(project):
    """`--processes 2` runs mpiexec as a child: a SIGTERM to the launcher alone (a scheduler, `kill`)
    is passed on; the ranks write a checkpoint and stop, and the launcher exits with their code."""
    assert_sigterm_to_the_launcher_stops_the_job(project / "syn.yaml", project / "launcher-term", 2,
                                                 ["training.epochs=400", "training.checkpoint.every_steps=1"])


def test_processes_beyond_the_machine_need_oversubscribe(project):
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(project / "many"), "--processes", "1000")
    assert result.returncode == 2 and "--processes 1000" in result.stderr and "--oversubscribe" in result.stderr
    assert "Traceback" not in result.stderr and not (project / "many").exists()


def test_commands_that_are_not_data_parallel_print_and_write_once_under_mpirun(project, tmp_path):
    model = project / "single" / "model.npz"
    data = tmp_path / "rows.npz"
    np.savez(data, x=np.random.default_rng(0).normal(size=(7, 10)).astype(np.float32))
    result = _magmadnn("predict", str(model), str(data), ranks=2)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "prediction" and len(result.stdout.splitlines()) == 8
    result = _magmadnn("validate", str(project / "syn.yaml"), ranks=2)
    assert result.returncode == 0 and result.stderr.count("valid") == 1


def test_launcher_variables_left_over_in_the_shell_are_one_message_naming_them(project, tmp_path):
    """PMI_SIZE=2 from another job, no launcher: a traceback (joining MPI to abort raised again) and
    a claim that a launcher started 2 processes."""
    result = _magmadnn("train", str(project / "syn.yaml"), "--out", str(tmp_path / "run"), "-q",
                       PMI_SIZE="2", PMI_RANK="0")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("error:") == 1 and "PMI_SIZE=2 says" in result.stderr, result.stderr
    assert "left over in this shell" in result.stderr and "  " not in result.stderr.split("(")[1], result.stderr
    assert not (tmp_path / "run").exists()
