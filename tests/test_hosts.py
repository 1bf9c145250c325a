"""`--processes N|auto` with `--hostfile FILE` / `--hosts h1:4,h2:4`: the host list as hydra reads it
(a malformed line named by file and line), Slurm's compressed node and task lists, what `auto` counts,
the mpiexec command, the resume hint keeping the layout, and SIGUSR1 (Slurm's warning before the time
limit) as "checkpoint and exit for requeue". The two-host run itself is in test_multihost.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from magmadnn_cli.distributed import hosts as H
from magmadnn_cli.errors import MagmaError

from conftest import assert_sigterm_to_the_launcher_stops_the_job, find_mpiexec, project, run_cli

NO_SLURM = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def test_a_hostfile_in_hydras_format(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# two nodes\nnode01:4\n\n  node02:2  \nnode03\n")
    assert H.read_hostfile(path) == [("node01", 4), ("node02", 2), ("node03", 1)]


def test_a_hostfile_in_open_mpis_format_with_comments_and_a_host_twice(tmp_path):
    """Open MPI's, Horovod's and DeepSpeed's `host slots=N` lines read as hydra's `host:N`; a comment
    may end a line; a host named twice takes the slots of both (its ranks consecutive, as one node's)."""
    path = tmp_path / "hosts"
    path.write_bytes("\ufeffnode01 slots=4 max_slots=8  # fast\r\nnode02:2 # gpu\r\nnode03\r\nnode01 slots = 2\r\n"
                     .encode())
    assert H.read_hostfile(path) == [("node01", 6), ("node02", 2), ("node03", 1)]


@pytest.mark.parametrize("line, found", [("node02:four", "'node02:four'"), ("node02:0", "'node02:0'"),
                                         ("node02 slots=0", "'node02 slots=0'"), ("a b", "'a b'"),
                                         ("node02 slots=2 cpus=3", "'node02 slots=2 cpus=3'"),
                                         ("node02:2 slots=2", "'node02:2 slots=2'"), (":4", "':4'"),
                                         ("node02:99999999999999999999", "'node02:99999999999999999999'")])
def test_a_malformed_hostfile_line_is_named_by_file_and_line(tmp_path, line, found):
    path = tmp_path / "hosts"
    path.write_text(f"# cluster\nnode01:4\n{line}\n")
    with pytest.raises(MagmaError) as caught:
        H.read_hostfile(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ") and found in message and "node01:4" in message, message


def test_a_hostfile_that_is_missing_or_empty(tmp_path):
    with pytest.raises(MagmaError, match="--hostfile .*nowhere: not found"):
        H.read_hostfile(tmp_path / "nowhere")
    (tmp_path / "empty").write_text("# nothing yet\n\n")
    with pytest.raises(MagmaError, match="names no host"):
        H.read_hostfile(tmp_path / "empty")


def test_hosts_option():
    assert H.parse_hosts("h1:4,h2:4") == [("h1", 4), ("h2", 4)]
    assert H.parse_hosts("h1, h2:2") == [("h1", 1), ("h2", 2)]
    assert H.parse_hosts("h1:2,h2,h1:2") == [("h1", 4), ("h2", 1)]
    for bad in ("h1:4,,h2", "h1:x", "", "h1:-2"):
        with pytest.raises(MagmaError, match="--hosts"):
            H.parse_hosts(bad)


@pytest.mark.parametrize("text, expected", [
    ("node07", ["node07"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu[8-10],cpu1", ["gpu8", "gpu9", "gpu10", "cpu1"]),
    ("r[1-2]n[09-10]", ["r1n09", "r1n10", "r2n09", "r2n10"]),
    ("a,b[1,3]-ib", ["a", "b1-ib", "b3-ib"]),
])
def test_slurm_node_lists_are_expanded(text, expected):
    assert H.expand_nodelist(text) == expected


def test_slurm_tasks_per_node_are_expanded():
    assert H.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert H.expand_tasks_per_node("16") == [16]
    with pytest.raises(MagmaError, match="SLURM_TASKS_PER_NODE"):
        H.expand_tasks_per_node("2(y3)")


@pytest.mark.parametrize("env, expected", [
    ({}, None),  # not inside an allocation
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "12", "SLURM_TASKS_PER_NODE": "4(x3)"}, 12),
    ({"SLURM_JOB_ID": "7", "SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_JOB_NODELIST": "n[1-3]"}, 10),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3", "SLURM_CPUS_ON_NODE": "8"}, 24),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_ON_NODE": "6"}, 12),
])
def test_auto_fills_the_slurm_allocation(env, expected):
    assert H.slurm_tasks(env) == expected


def test_what_auto_counts(tmp_path):
    cores = len(os.sched_getaffinity(0))
    layout = H.resolve_layout("auto", None, None, configured=1, env=NO_SLURM)
    assert (layout.processes, layout.hosts) == (cores, [])
    assert H.resolve_layout("auto", None, "a:4,b:2", 1, NO_SLURM).processes == 6
    (tmp_path / "hf").write_text("a:3\nb\n")
    assert H.resolve_layout(None, tmp_path / "hf", None, 1, NO_SLURM).processes == 4  # hosts alone: all slots
    assert H.resolve_layout(None, tmp_path / "hf", None, 2, NO_SLURM).processes == 2  # the config's count
    assert H.resolve_layout("3", tmp_path / "hf", None, 1, NO_SLURM).processes == 3
    slurm = dict(NO_SLURM, SLURM_JOB_ID="5", SLURM_NTASKS="8")
    assert H.resolve_layout("auto", None, None, 1, slurm).processes == 8
    assert H.resolve_layout("auto", None, "a:2", 1, slurm).processes == 2  # hosts given win


@pytest.mark.parametrize("args, message", [
    (("--processes", "many"), "--processes: expected a whole number of ranks (1 or more) or auto; received 'many'"),
    (("--processes", "0"), "received '0'"),
    (("--hosts", "a:2", "--hostfile", "hf"), "--hostfile and --hosts both name the hosts; give one"),
    (("--hosts", "a:2,b:x"), "--hosts: 'b:x'"),
    (("--hosts", "a:2,b:2", "--processes", "9"), "--processes 9: the hosts of --hosts offer 4 slots"),
])
@pytest.mark.parametrize("command", ["train", "tune", "lr-find"])
def test_layout_mistakes_are_one_message_and_exit_2(capsys, tmp_path, command, args, message):
    config = project(tmp_path)
    code, _, err = run_cli(capsys, command, config, "--out" if command != "lr-find" else "--steps",
                           str(tmp_path / "o") if command != "lr-find" else "3", *args)
    assert code == 2 and message in err, err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_the_mpiexec_command_names_the_hosts(tmp_path):
    hydra, openmpi = "HYDRA build details:\n    Version: 5.0.2", "mpiexec (Open MPI) 4.1.5"
    (tmp_path / "hf").write_text("a:3\nb\n")
    argv = ["train", "c.yaml"]
    by_file = H.resolve_layout("auto", tmp_path / "hf", None, 1, NO_SLURM)
    command = H.mpiexec_command("/x/mpiexec", hydra, by_file, argv)
    assert command[:5] == ["/x/mpiexec", "-hosts", "a:3,b:1", "-n", "4"]  # hydra reads no Open MPI lines
    assert command[-3:] == ["magmadnn_cli", "train", "c.yaml"]
    by_list = H.resolve_layout("3", None, "a:2,b:2", 1, NO_SLURM)
    assert H.mpiexec_command("/x/mpiexec", hydra, by_list, argv)[1:5] == ["-hosts", "a:2,b:2", "-n", "3"]
    assert "--host" in H.mpiexec_command("/x/mpirun", openmpi, by_file, argv)
    assert "a:3,b:1" in H.mpiexec_command("/x/mpirun", openmpi, by_file, argv)
    here = H.resolve_layout("2", None, None, 1, NO_SLURM)  # this machine, or hydra's view of the allocation
    assert H.mpiexec_command("/x/mpiexec", hydra, here, argv)[1:3] == ["-n", "2"]


@pytest.mark.parametrize("argv, ranks, expected", [
    (["train", "c.yaml", "--processes", "auto", "--hostfile", "hf", "-q"], 4,
     "magmadnn train c.yaml --processes auto --hostfile hf -q --resume runs/x"),
    (["train", "c.yaml", "--hosts=a:2,b:2", "-n", "4", "--resume", "runs/old"], 4,
     "magmadnn train c.yaml --hosts=a:2,b:2 -n 4 --resume runs/x"),
    (["train", "c.yaml", "-q"], 4, "magmadnn train c.yaml -q --processes 4 --resume runs/x"),  # mpiexec -n 4 magmadnn
    (["train", "c.yaml", "--processes", "2"], 2, "magmadnn train c.yaml --processes 2 --resume runs/x"),
    (["train", "c.yaml", "--out", "runs/x", "--overwrite", "-o", "runs/x", "--out=runs/x", "-q"], 1,
     "magmadnn train c.yaml -q --resume runs/x"),  # the run folder is the one --resume names
])
def test_the_resume_hint_keeps_the_layout_as_given(monkeypatch, argv, ranks, expected):
    from magmadnn_cli.training.advice import resume_command
    monkeypatch.setattr(sys, "argv", ["magmadnn", *argv])
    assert resume_command(Path("runs/x"), ranks) == expected


MPIEXEC = find_mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")


@needs_mpi
def test_auto_over_the_hosts_given_starts_one_rank_per_slot(tmp_path):
    """hydra's fork launcher starts every "host" here: the ranks are laid out by the host list."""
    config = project(tmp_path)
    env = {k: v for k, v in NO_SLURM.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(HYDRA_LAUNCHER="fork", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(tmp_path / "run"),
                           "-q", "--processes", "auto", "--hosts", "nodea:2,nodeb:1", "--set", "training.epochs=2"],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=180)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["processes"] == 3


@needs_mpi
def test_sigusr1_checkpoints_and_exits_for_requeue(tmp_path):
    """`#SBATCH --signal=B:USR1@90` warns the batch shell (here: the launcher) before the time limit:
    every rank writes a checkpoint and stops, exit 128 + 10, with the command that resumes."""
    config = project(tmp_path)
    assert_sigterm_to_the_launcher_stops_the_job(config, tmp_path / "run", 2,
                                                 ["training.epochs=400", "training.checkpoint.every_steps=1"],
                                                 sig=signal.SIGUSR1)


def test_a_config_count_beyond_the_hosts_names_the_config_key(capsys, tmp_path):
    config = project(tmp_path)
    code, _, err = run_cli(capsys, "train", config, "--hosts", "a:2", "--set", "distributed.processes=3")
    assert code == 2 and "--set distributed.processes=3: the hosts of --hosts offer 2 slots" in err, err  # what gave it
    config.write_text(config.read_text() + "distributed: {processes: 3}\n")
    code, _, err = run_cli(capsys, "train", config, "--hosts", "a:2")
    assert code == 2 and f"{config}:" in err and "distributed.processes: 3: the hosts of --hosts offer 2" in err, err


@needs_mpi
def test_a_host_that_cannot_be_reached_is_named_with_the_fix(tmp_path):
    """hydra could not start a host's proxy (the name does not resolve, ssh is refused: here a launcher
    command that fails for nodeb as ssh does, exit 255). hydra's own lines say 'Launch proxy failed';
    the launcher then says which hosts it was given and what each needs, exit 255, nothing written."""
    config = project(tmp_path)
    rsh = tmp_path / "rsh.sh"
    rsh.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nhost=$1; shift\n'
                   'case $host in nodea) exec "$@";; *) echo "ssh: Could not resolve hostname $host" >&2; exit 255;; esac\n')
    rsh.chmod(0o755)
    env = {k: v for k, v in NO_SLURM.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=str(rsh), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(tmp_path / "run"),
                           "-q", "--processes", "auto", "--hosts", "nodea:1,nodeb:1"],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=180)
    assert done.returncode == 255, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: mpiexec could not start the ranks on every host") and "nodea, nodeb" in last, last
    assert "passwordless ssh" in last and "docs/clusters.md" in last and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "model.npz").exists()


FAKE_HYDRA = """\
import os, signal, subprocess, sys, time
if "--version" in sys.argv:
    print("HYDRA build details:\\n    Version: 5.0.2")
    sys.exit(0)
proxy = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))", os.environ["PROXY_LIVES"]])
proxy.wait()  # a proxy that lives a while (a job), or exits at once (it could not connect back)
if os.environ["HANGS"] == "1":
    signal.pause()  # as hydra under Slurm does once srun's proxies have exited
"""


@pytest.mark.parametrize("hangs", [True, False], ids=["proxies-gone", "proxy-working"])
def test_an_mpiexec_left_without_proxies_is_ended_and_a_working_one_is_not(tmp_path, monkeypatch, hangs):
    """Seen on a real two-node Slurm: node names that did not resolve made hydra's proxies exit, and
    mpiexec waited forever (until the job's time limit). The launcher ends an mpiexec that has had no
    process of its own for LONELY s, naming the likely cause; one whose proxy runs is left alone."""
    from magmadnn_cli.distributed import launcher
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!{sys.executable}\n{FAKE_HYDRA}")
    fake.chmod(0o755)
    monkeypatch.setattr(launcher, "locate_mpi_launcher", lambda: str(fake))
    monkeypatch.setattr(launcher, "LONELY", 1.0)
    monkeypatch.setenv("HANGS", "1" if hangs else "0")
    monkeypatch.setenv("PROXY_LIVES", "0" if hangs else "4")  # longer than LONELY: alone it would count
    if not hangs:
        assert launcher.launch(H.Layout(processes=2), ["train", "c.yaml"]) == 0
        return
    with pytest.raises(MagmaError, match="mpiexec has had no proxy or rank left for 1 s") as caught:
        launcher.launch(H.Layout(processes=2), ["train", "c.yaml"])
    assert "resolve on every node" in str(caught.value) and caught.value.exit_code == 255


@pytest.mark.parametrize("args, fine", [(("--processes", "3"), False), (("--hosts", "a:2"), False),
                                        (("--processes", "2"), True), (("--processes", "auto"), True)])
def test_a_layout_that_contradicts_the_launcher_that_started_the_ranks_is_refused(capsys, tmp_path, monkeypatch,
                                                                                    args, fine):
    """`mpirun -n 2 magmadnn train ... --processes 3` trained on 2 ranks without a word."""
    from magmadnn_cli.distributed.launcher import relaunch
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    processes, hosts = (args[1], None) if args[0] == "--processes" else (None, args[1])
    if fine:
        assert relaunch(processes, None, hosts, False, 1, "distributed.processes") is None
        return
    with pytest.raises(MagmaError, match=r"this process is one of 2 ranks that mpiexec or srun started: its -n decides"):
        relaunch(processes, None, hosts, False, 1, "distributed.processes")
