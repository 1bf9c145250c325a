"""Launch variables left over in a shell, and inputs a cluster user gives by mistake (issue 44, item 7):
a stale PMI_RANK/PMI_SIZE makes every command name it (predict and env exited 0 and did nothing);
a hostfile of /dev/zero or a huge file is refused by size; `env` answers cleanly with a node list of
a hundred million nodes or a PMI_SIZE that is no number (a MemoryError, and an MPI abort, exit 16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from magmadnn_cli.distributed import hosts as H
from magmadnn_cli.errors import MagmaError

from conftest import BLOBS_CONFIG, ROOT, project

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "MAGMADNN_"))}


def _magmadnn(*args, env: dict[str, str], cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "magmadnn_cli", *map(str, args)], capture_output=True, text=True,
                          env={**CLEAN, "PYTHONPATH": str(ROOT), "COLUMNS": "250", **env}, cwd=cwd, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("leftovers")
    config = project(folder, BLOBS_CONFIG.replace("epochs: 15", "epochs: 1"))
    done = _magmadnn("train", config, "--out", folder / "run", "-q", env={})
    assert done.returncode == 0, done.stderr
    return folder


@pytest.mark.parametrize("stale", [{"PMI_RANK": "1", "PMI_SIZE": "2"}, {"PMI_RANK": "0", "PMI_SIZE": "4"},
                                   {"PMI_SIZE": "2"}])
def test_predict_names_a_stale_launch_variable(run, stale):
    done = _magmadnn("predict", run / "run", run / "blobs.csv", env=stale)
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2 and "PMI_SIZE" in text and "unset" in text and "Traceback" not in text, text
    assert "Abort" not in text


def test_env_names_a_stale_launch_variable_and_answers(run):
    done = _magmadnn("env", "--json", env={"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert "PMI_RANK=1" in facts["launched_by"] and "unset" in facts["launched_by"], facts["launched_by"]
    assert "PMI_RANK=1" in done.stderr
    table = _magmadnn("env", env={"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert table.returncode == 0 and "PMI_RANK=1" in " ".join(table.stdout.split()), table.stdout + table.stderr


@pytest.mark.parametrize("command", [["env"], ["env", "--json"], ["validate"]])
def test_a_pmi_size_that_is_no_number_is_a_clean_answer(run, command):
    args = [*command, *([run / "c.yaml"] if command == ["validate"] else [])]
    done = _magmadnn(*args, env={"PMI_SIZE": "abc"})
    text = done.stdout + done.stderr
    assert "PMI_SIZE" in text and "'abc'" in text and "Abort" not in text and "Internal MPI error" not in text, text
    assert done.returncode == (0 if command[0] == "env" else 2), text


def test_env_with_a_node_list_of_a_hundred_million_nodes_answers_at_once():
    started = time.monotonic()
    done = _magmadnn("env", "--json", env={"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-99999999]"}, timeout=60)
    assert done.returncode == 0 and time.monotonic() - started < 30, done.stderr
    facts = json.loads(done.stdout)
    assert "SLURM_JOB_NODELIST" in str(facts["slurm_tasks"]) and "99,999,999" in str(facts["slurm_tasks"]), facts


@pytest.mark.parametrize("text", ["n[1-99999999]", "a[1-5000]b[1-5000]", "x[0-9999999999999999999]"])
def test_node_lists_are_bounded(text):
    with pytest.raises(MagmaError, match="SLURM_JOB_NODELIST"):
        H.expand_nodelist(text)
    with pytest.raises(MagmaError, match="SLURM_JOB_NODELIST"):
        H.slurm_tasks({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": text})


def test_tasks_per_node_are_bounded():
    assert H.slurm_tasks({"SLURM_JOB_ID": "1", "SLURM_TASKS_PER_NODE": "2(x3),1"}) == 7
    with pytest.raises(MagmaError, match="SLURM_TASKS_PER_NODE"):
        H.slurm_tasks({"SLURM_JOB_ID": "1", "SLURM_TASKS_PER_NODE": "2(x99999999999)"})


@pytest.mark.parametrize("make", ["zero", "huge", "binary"])
def test_a_hostfile_that_is_a_device_or_huge_is_refused_by_size(tmp_path, make):
    path = {"zero": lambda: "/dev/zero"}.get(make, lambda: str(tmp_path / "hosts"))()
    if make == "huge":
        with open(path, "w") as f:
            f.write("node01:4\n" * (3 << 20))  # 27 MB of valid lines
    elif make == "binary":
        (tmp_path / "hosts").write_bytes(b"node01:4\n\x00\x01\x02" * 10)
    with pytest.raises(MagmaError, match="--hostfile") as caught:
        H.read_hostfile(path)
    assert len(str(caught.value)) < 400
