"""Node-aware ranks: BLAS threads = the node's cores / the ranks sharing them (learnt through MPI's
shared-memory split once MPI runs, the launcher's hint before numpy loads); GPUs by node-local rank
modulo the visible devices, with a warning when a node's ranks outnumber its GPUs (cupy mocked)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import ROOT, find_mpiexec
from magmadnn_cli.core import backend as B
from magmadnn_cli.core import blas
from magmadnn_cli.distributed.launcher import threads_per_rank

MPIEXEC = find_mpiexec()


@pytest.mark.parametrize("mine, node, expected", [
    ({0, 1, 2, 3, 4, 5, 6, 7}, [set(range(8))] * 4, 2),          # 4 unbound ranks share 8 cores
    ({0, 1, 2, 3}, [{0, 1, 2, 3}, {4, 5, 6, 7}], 4),              # bound: each its own 4 cores
    ({0}, [{0}, {0}, {0}], 1),                                    # more ranks than cores: 1 each
    (set(range(16)), [set(range(16))], 16),                       # alone on its node
])
def test_threads_are_the_ranks_cpus_shared_out_among_the_ranks_on_them(mine, node, expected):
    assert threads_per_rank(mine, node) == expected


def test_blas_threads_can_be_set_at_run_time():
    before = blas.get_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not the OpenBLAS it ships with")
    try:
        assert blas.set_threads(1) and blas.get_threads() == 1
    finally:
        blas.set_threads(before)


SCRIPT = """\
import os, sys
os.environ["MPI_LOCALNRANKS"] = "1"  # a launcher's hint that is wrong (as on a node it did not describe)
from magmadnn_cli.distributed.launcher import before_numpy
before_numpy()
from magmadnn_cli.core import blas
hinted = blas.get_threads()
from magmadnn_cli.distributed.mpi import MPICommunicator
comm = MPICommunicator()
open(sys.argv[1] + f"/rank{comm.rank}", "w").write(f"{hinted} {blas.get_threads()} {len(os.sched_getaffinity(0))}")
"""


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")
@pytest.mark.skipif(blas.get_threads() is None, reason="numpy's BLAS is not the OpenBLAS it ships with")
def test_ranks_on_one_node_share_its_cores_as_mpi_finds_them(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_", "OMP_", "OPENBLAS_", "MKL_"))}
    done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(tmp_path / "s.py"), str(tmp_path)],
                          capture_output=True, text=True, env=dict(env, PYTHONPATH=str(ROOT)), timeout=120)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        hinted, threads, cores = map(int, (tmp_path / f"rank{rank}").read_text().split())
        assert hinted == cores  # the hint said 1 rank on the node
        assert threads == max(1, cores // 2)  # MPI found 2


def test_a_user_choice_of_threads_is_kept(monkeypatch):
    from magmadnn_cli.distributed import launcher
    env = {"OMP_NUM_THREADS": "3"}
    launcher.limit_blas_threads(4, env)
    assert env == {"OMP_NUM_THREADS": "3"} and not launcher.node_threads_ours(env)


# -- GPUs (cupy mocked: the suite runs where there is none) --------------------------------------------
def _fake_gpus(count: int, used: list[int]) -> B.Backend:
    class Device:
        def __init__(self, index: int) -> None:
            self.index = index

        def use(self) -> None:
            used.append(self.index)

    cuda = types.SimpleNamespace(Device=Device, runtime=types.SimpleNamespace(getDeviceCount=lambda: count))
    return B.Backend(types.SimpleNamespace(cuda=cuda), "gpu", np.float32)


@pytest.mark.parametrize("local_rank, device", [(0, 0), (1, 1), (2, 0), (3, 1)])
def test_a_rank_takes_the_gpu_of_its_node_local_rank_modulo_the_gpus(local_rank, device):
    used: list[int] = []
    with B.using(_fake_gpus(2, used)):
        B.use_gpu_device(local_rank)
    assert used == [device]


def test_more_ranks_on_a_node_than_gpus_is_warned():
    with B.using(_fake_gpus(2, [])):
        assert B.gpu_sharing(2) is None
        note = B.gpu_sharing(4)
    assert note is not None and "4 ranks" in note and "2 GPUs" in note and "at most 2 ranks per node" in note
