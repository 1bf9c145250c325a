"""What a run records of how it ran: the run log, metrics.json and config.yaml say the strategy actually
used (what `auto` chose), the MPI library and its transport, and how many ranks ran on each host;
config.yaml stays a config that trains again."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, find_mpiexec, project
from magmadnn_cli.distributed.environment import transport

MPIEXEC = find_mpiexec()
mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")
MPICH = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\nMPICH configure:    --with-device=ch4:ucx,ofi\n"


def _train(folder, *sets: str, ranks: int = 2, **env: str) -> subprocess.CompletedProcess:
    config = project(folder)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_", "MPIR_CVAR", "UCX_"))}
    environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT), COLUMNS="200", **env)
    done = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "magmadnn_cli", "train", str(config),
                           "--out", str(folder / "run"), "--set", "training.epochs=1",
                           *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True, env=environ, timeout=180)
    assert done.returncode == 0, done.stderr
    return done


@mpi
def test_auto_records_what_it_chose_the_mpi_its_transport_and_ranks_per_host(tmp_path):
    done = _train(tmp_path, MPIR_CVAR_CH4_NETMOD="ofi")
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())["distributed"]
    assert record["strategy"] == "shared_memory" and record["configured_strategy"] == "auto"
    assert record["ranks_per_host"] == {socket.gethostname(): 2}
    assert record["mpi_library"].startswith("MPICH Version:") and "\n" not in record["mpi_library"]
    assert record["mpi_transport"].startswith("shared memory (every rank on one host; between hosts: ofi (MPIR_CVAR_CH4_NETMOD=ofi)")
    log = " ".join(done.stdout.split())  # as said, whatever the terminal's width
    assert "strategy shared_memory (auto chose it)" in log and f"{socket.gethostname()}: 2 ranks" in log
    assert "transport shared memory (every rank on one host; between hosts: ofi" in log
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert written.startswith("# trained with strategy shared_memory (auto chose it)")
    assert yaml.safe_load(written)["distributed"]["strategy"] == "auto"  # re-runs choose again for their layout


@mpi
def test_a_named_strategy_is_recorded_and_config_yaml_trains_again(tmp_path):
    _train(tmp_path, "distributed.strategy=ring")
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())["distributed"]
    assert record["strategy"] == record["configured_strategy"] == "ring"
    assert record["mpi_transport"].startswith("shared memory (every rank on one host; between hosts: ucx (")
    again = subprocess.run([sys.executable, "-m", "magmadnn_cli", "validate", str(tmp_path / "run" / "config.yaml")],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("library, env, expected", [
    (MPICH, {}, "ucx (MPICH's default: the first of its netmods ch4:ucx ofi)"),
    (MPICH, {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}, "ofi (MPIR_CVAR_CH4_NETMOD=ofi), FI_PROVIDER=tcp"),
    (MPICH, {"UCX_TLS": "self,tcp"}, "ucx (MPICH's default: the first of its netmods ch4:ucx ofi), UCX_TLS=self,tcp"),
    ("Open MPI v4.1.5, package: Open MPI", {"OMPI_MCA_pml": "ucx"}, "ucx (OMPI_MCA_pml=ucx)"),
    ("Open MPI v4.1.5, package: Open MPI", {}, "unknown (Open MPI chooses its PML at run time; OMPI_MCA_pml unset)"),
    ("Intel(R) MPI Library 2021.10", {}, "unknown"),
])
def test_the_transport_is_said_as_far_as_it_can_be_known(library, env, expected):
    assert transport(library, env) == expected
