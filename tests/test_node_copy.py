"""One copy of the prepared data per node (issue 48, item 1): under MPI one rank per node runs the
preparation and the node's other ranks map its arrays from shared memory; a refusal on the preparing
rank is said once and ends every rank; training results do not change (tests/test_rank_invariance.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, assert_same_weights, find_mpiexec, train_on

MPIEXEC = find_mpiexec()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec in this environment")]

SCRIPT = """\
import sys
from dataclasses import dataclass
import numpy as np
from magmadnn_cli.distributed.mpi import MPICommunicator
from magmadnn_cli.distributed.shared import once_per_node
from magmadnn_cli.errors import DataError

@dataclass
class Part:
    x: np.ndarray
    y: np.ndarray

@dataclass
class Made:
    train: Part
    small: np.ndarray
    made_by: int

comm = MPICommunicator()

def make():
    if sys.argv[2] == "fail":
        raise DataError("data.csv: row 3 has no target")
    x = np.arange(300_000, dtype=np.float64).reshape(1000, 300) * (comm.rank + 1)
    return Made(Part(x, np.arange(1000)), np.ones(3), comm.rank)

got = once_per_node(comm, make)

def mapping(address):
    for line in open("/proc/self/maps"):
        span, _, _, _, inode, *path = line.split()
        lo, hi = (int(v, 16) for v in span.split("-"))
        if lo <= address < hi:
            return f"{inode} {' '.join(path)}"

with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as out:
    out.write(f"{got.made_by}|{got.train.x.sum()}|{got.train.y.sum()}|{got.small.sum()}|"
              f"{got.train.x.flags.writeable}|{mapping(got.train.x.ctypes.data)}")
"""


def _run(tmp_path, ranks: int, mode: str = "ok", per_node: int = 0) -> subprocess.CompletedProcess:
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    if per_node:
        env["MAGMADNN_RANKS_PER_NODE"] = str(per_node)
    return subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, str(tmp_path / "s.py"), str(tmp_path), mode],
                          capture_output=True, text=True, env=dict(env, PYTHONPATH=str(ROOT)), timeout=120)


def _results(tmp_path, ranks: int) -> list[list[str]]:
    return [(tmp_path / f"rank{r}").read_text().split("|") for r in range(ranks)]


def test_one_rank_per_node_prepares_and_the_others_map_its_arrays(tmp_path):
    done = _run(tmp_path, 3)
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path, 3)
    assert {r[0] for r in results} == {"0"}  # made once, by the node's first rank
    assert len({tuple(r[1:4]) for r in results}) == 1  # the same contents everywhere
    assert {r[4] for r in results} == {"False"}  # shared: nobody writes into another rank's data
    inodes = {r[5] for r in results}
    assert len(inodes) == 1 and not inodes.pop().startswith("0 ")  # one shared file mapping, not private memory


def test_each_node_prepares_its_own_copy(tmp_path):
    done = _run(tmp_path, 4, per_node=2)  # ranks 0-1 and 2-3 play two nodes
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path, 4)
    assert [r[0] for r in results] == ["0", "0", "2", "2"]
    assert results[0][5] == results[1][5] != results[2][5] == results[3][5]


def test_a_refusal_on_the_preparing_rank_ends_every_rank_with_its_message(tmp_path):
    done = _run(tmp_path, 2, mode="fail")
    assert done.returncode != 0
    assert "data.csv: row 3 has no target" in done.stderr + done.stdout
    assert not any((tmp_path / f"rank{r}").exists() for r in range(2))


def test_two_ranks_train_the_one_process_weights_from_the_node_copy(tmp_path):
    sets = ["training.epochs=2", "precision=float64", "training.checkpoint=false"]
    one = train_on(tmp_path / "one", sets)
    for strategy in ("allreduce", "shared_memory"):
        two = train_on(tmp_path / strategy, [*sets, f"distributed.strategy={strategy}"], ranks=2)
        assert_same_weights(two, one, 1e-10)
