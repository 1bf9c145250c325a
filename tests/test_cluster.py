"""MPI jobs end cleanly: every MPI object the tool made (shared-memory windows, split communicators) is
freed before MPI_Finalize, so the job exits 0 under MPICH's OFI transport too; a rank that fails
alone (a data file missing on its node) is named with its host and ends the job instead of leaving the
others waiting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, find_mpiexec, project

MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")
OFI = {"MPIR_CVAR_CH4_NETMOD": "ofi"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return env


def test_every_mpi_object_is_freed_before_finalize(tmp_path):
    script = tmp_path / "windows.py"
    script.write_text(
        "import numpy as np\nfrom mpi4py import MPI\n"
        "from magmadnn_cli.distributed.shared import SharedMemoryCommunicator\n"
        "comm = SharedMemoryCommunicator()\ncomm.allocate_shared(10, np.dtype(np.float64))\n"
        "comm.split(comm.rank % 2, comm.rank)\nmade = list(comm.owned)\ncomm.release()\n"
        "assert not comm.owned and all(h in (MPI.COMM_NULL, MPI.WIN_NULL) for h in made), made\n"
        f"open(r'{tmp_path}' + f'/rank{{comm.rank}}.txt', 'w').write(f'freed {{len(made)}}')\n")
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          env=_env(**OFI), timeout=120)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):  # local and cross communicators, the window, a split part (a file each: no interleaving)
        assert (tmp_path / f"rank{rank}.txt").read_text() == "freed 4"


def test_a_shared_memory_run_exits_0_under_ofi(tmp_path):
    config = project(tmp_path)
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m", "magmadnn_cli", "train", str(config),
                           "--out", str(tmp_path / "run"), "-q", "--set", "distributed.strategy=shared_memory",
                           "--set", "training.epochs=2"], capture_output=True, text=True, env=_env(**OFI), timeout=180)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "model.npz").is_file() and "fabricclose" not in done.stderr


def test_a_file_missing_on_one_node_names_the_rank_and_host_and_ends_the_job(tmp_path):
    for folder in ("a", "b"):  # two working folders, as two nodes' local disks; only a's holds the data
        (tmp_path / folder).mkdir()
        project(tmp_path / folder)
    (tmp_path / "b" / "blobs.csv").unlink()
    rank = [sys.executable, "-m", "magmadnn_cli", "train", "c.yaml", "--out", str(tmp_path / "run"), "-q"]
    done = subprocess.run([str(MPIEXEC), "-n", "1", "-wdir", str(tmp_path / "a"), *rank, ":", "-n", "1", "-wdir",
                           str(tmp_path / "b"), *rank], capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"rank 1 on {socket.gethostname()}: error:" in done.stderr and "blobs.csv not found" in done.stderr


def test_env_says_what_a_run_would_use():
    import json
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "env", "--json"], capture_output=True, text=True,
                          env=_env(), timeout=60)  # its own process: it starts MPI to ask its version
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["cores"] >= 1 and facts["mpi_launcher"] == str(MPIEXEC) and "MPICH" in facts["mpi_library"]
    assert facts["blas"] and facts["dev_shm_free"] > 0 and facts["launched_ranks"] == 0
    table = subprocess.run([sys.executable, "-m", "magmadnn_cli", "env"], capture_output=True, text=True, env=_env(),
                           timeout=60).stdout
    assert "none: not started by mpiexec or srun" in " ".join(table.split()), table  # not a bare 0


def test_env_inside_a_slurm_allocation_and_an_srun_step_without_mpi():
    """Inside an allocation of 10 tasks `env` said 8 ranks at most (this machine's cap), where training
    takes 10; in an srun step with no MPI plugin it said 'not started by srun' beside 'this rank 1'."""
    import json
    allocation = dict(_env(), SLURM_JOB_ID="4242", SLURM_TASKS_PER_NODE="4(x2),2", SLURM_JOB_NODELIST="node[01-03]")
    facts = json.loads(subprocess.run([sys.executable, "-m", "magmadnn_cli", "env", "--json"], capture_output=True,
                                      text=True, env=allocation, timeout=60).stdout)
    assert facts["ranks_to_fill_this_machine_or_allocation"] == 10 == facts["processes_max_without_oversubscribe"]
    assert isinstance(facts["blas_threads"], dict)
    assert facts["slurm_tasks"] == 10
    step = dict(allocation, SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1", COLUMNS="250")
    table = " ".join(subprocess.run([sys.executable, "-m", "magmadnn_cli", "env"], capture_output=True, text=True,
                                    env=step, timeout=60).stdout.split())
    assert "not started by mpiexec or srun" not in table, table
    assert "srun step of 2 tasks with no MPI plugin" in table and "--mpi=pmi2" in table, table


@pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
def test_env_under_mpiexec_answers_once_without_waiting_for_the_other_ranks():
    """`mpiexec -n 2 magmadnn env` hung for good: rank 1 left at once (env runs on rank 0 only) while
    rank 0 started MPI to ask its version, and MPI_Init waited for rank 1."""
    import json
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m", "magmadnn_cli", "env", "--json"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)  # once: rank 0's
    assert "MPICH" in facts["mpi_library"] and facts["launched_ranks"] == 2 and facts["this_rank"] == 0


@pytest.mark.parametrize("plugin,variables", [
    ("pmix", {"PMIX_RANK": "3", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"}),
    ("pmi2", {"PMI_FD": "5", "PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}),
    ("pmix without rank count", {"PMIX_RANK": "3", "PMIX_NAMESPACE": "slurm.pmix.1.0", "SLURM_STEP_ID": "0",
                                 "SLURM_NTASKS": "4", "SLURM_PROCID": "3"}),
])
def test_srun_is_recognized_as_a_ranked_run(monkeypatch, plugin, variables):
    from magmadnn_cli.distributed import comm
    for key in [k for k in os.environ if k.startswith(("PMI", "SLURM", "OMPI_", "MPI_LOCAL"))]:
        monkeypatch.delenv(key)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    assert comm.launched_ranks() == 4 and comm.launched_rank() == 3, plugin
    monkeypatch.delenv("SLURM_STEP_ID")  # a batch script's own process: not an srun task
    if "PMI_SIZE" not in variables:
        assert comm.launched_ranks() == 0


def _srun_task(tmp_path, procid: int, **plugin: str) -> subprocess.CompletedProcess:
    """`magmadnn train` as task `procid` of a 2-task srun step (the variables a real Slurm 22.05 sets),
    with `plugin`'s variables (none: `srun --mpi=none`)."""
    config = project(tmp_path)
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
             "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid), "SLURM_NODEID": "0"}
    env = {k: v for k, v in _env(**slurm, **plugin).items() if not k.startswith(("PMIX_", "OMPI_"))}
    return subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out",
                           str(tmp_path / "run"), "-q"], capture_output=True, text=True, env={**env, **plugin},
                          timeout=120)


def test_srun_without_an_mpi_plugin_is_refused_before_anything_runs(tmp_path):
    """`srun --mpi=none -n 2` (many clusters' default) gives its tasks no PMI: each would be a
    one-process run of its own, into the same folder (real Slurm: the second task met the first's lock)."""
    first, second = _srun_task(tmp_path, 0), _srun_task(tmp_path, 1)
    assert first.returncode == second.returncode == 2, first.stderr + second.stderr
    assert "srun started 2 tasks with no MPI plugin" in first.stderr and "--mpi=pmi2" in first.stderr
    assert "Traceback" not in first.stderr and second.stderr == ""  # said once, by task 0
    assert not (tmp_path / "run").exists()


def test_srun_pmix_with_an_mpi_built_without_pmix_is_refused_before_mpi_starts(tmp_path):
    """Real Slurm, `srun --mpi=pmix` and the PyPI mpich: MPI_Init aborted with 'Runtime environment
    uses unsupported PMI version PMIx' (exit 16). The task is refused first, with the fix."""
    from magmadnn_cli.distributed.environment import mpi_library_text_without_init
    library = mpi_library_text_without_init()
    if not library.startswith("MPICH") or "pmix" in library.lower():
        pytest.skip(f"not an MPICH without PMIx ({library.splitlines()[0] if library else 'no MPI'}): nothing to refuse")
    done = _srun_task(tmp_path, 0, PMIX_RANK="0", PMIX_NAMESPACE="slurm.pmix.7.0", PMIX_VERSION="4.2.2")
    assert done.returncode == 2, done.stderr
    assert "srun --mpi=pmix" in done.stderr and "without PMIx" in done.stderr and "--mpi=pmi2" in done.stderr
    assert "Traceback" not in done.stderr and "internal_Init_thread" not in done.stderr
    assert not (tmp_path / "run").exists()
