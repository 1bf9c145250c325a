"""Two hosts in one machine: two Linux network namespaces, each with its own hostname (a UTS namespace
per process tree), joined by a veth pair; TCP between them (UCX_TLS=self,tcp: no shared memory, as
between real hosts); one file system, as a cluster's shared one. hydra starts the second host's ranks
through `-launcher ssh -launcher-exec rsh.sh`, a script that runs the command in that host's namespace.
`magmadnn train --processes 4 --hostfile` over them gives the one-process weights; a rank SIGKILLed on
the second host ends the job with nothing left; SIGTERM to the launcher checkpoints and `--resume` is
bit-identical; the collective timeout ends a job whose rank on the second host is SIGSTOPped, or
whose hosts the network splits. Needs root, `ip` and `unshare` (CI has them); skipped, saying why,
elsewhere."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (BLOBS_CONFIG, assert_same_weights, blobs_csv, find_mpiexec, job_processes, run_train,
                      saved_weights, wait_until_gone)

MPIEXEC = find_mpiexec()
HOSTS = {"10.231.0.1": "node-a", "10.231.0.2": "node-b"}  # address -> hostname; one namespace each
CONFIG = BLOBS_CONFIG.replace("epochs: 15", "epochs: 10")  # 480 training rows, batch 16: 30 steps an epoch
RSH = """#!/bin/sh
# hydra's ssh launcher runs: rsh.sh [-x] HOST COMMAND...; run COMMAND in HOST's namespace, as HOST
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
echo "$host" >> "$(dirname "$0")/launched-on"
case $host in
%s
  *) echo "rsh.sh: unknown host $host" >&2; exit 255;;
esac
"""


def _missing() -> str | None:
    """Why this machine cannot make the two hosts (None: it can)."""
    if MPIEXEC is None:
        return "no mpiexec (pip install mpich)"
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "network namespaces need Linux and root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2, util-linux)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _pids(namespace: str) -> set[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    return {int(p) for p in done.stdout.split()}


class Cluster:
    """Two namespaces `names`, a hostfile naming their addresses, and how to run a command on the first."""

    def __init__(self, folder: Path, tag: str) -> None:
        self.folder, self.names = folder, [f"mdnn{tag}a", f"mdnn{tag}b"]
        self.links = [f"md{tag}a", f"md{tag}b"]
        self.hostfile = folder / "hostfile"

    def create(self) -> None:
        for name in self.names:
            _ip("netns", "add", name)
        _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
        for name, link, address in zip(self.names, self.links, HOSTS):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("netns", "exec", self.names[1], "unshare", "--uts", "true")  # a hostname of its own is possible
        cases = "\n".join(f"  {address}) exec ip netns exec {name} unshare --uts sh -c \"hostname {host} && exec $*\";;"
                          for (address, host), name in zip(HOSTS.items(), self.names))
        rsh = self.folder / "rsh.sh"
        rsh.write_text(RSH % cases)
        rsh.chmod(0o755)
        first, second = HOSTS  # hydra's format, then Open MPI's (Horovod's, DeepSpeed's)
        self.hostfile.write_text(f"# two simulated hosts, two slots each\n{first}:2\n{second} slots=2  # the second\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_", "SLURM_", "HYDRA_"))}
        self.env.update(HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=str(rsh), UCX_TLS="self,tcp",
                        OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    def delete(self) -> None:
        """Every process left in the namespaces, the namespaces, and so the veth pair (also if half made)."""
        for name in self.names:
            for pid in _pids(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name in self.names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "delete", self.links[0]], capture_output=True, timeout=30)  # if never moved

    def start(self, *args: str) -> subprocess.Popen:
        """`magmadnn ARGS` on the first host (node-a), its own process group."""
        command = ["ip", "netns", "exec", self.names[0], "unshare", "--uts", "sh", "-c",
                   f"hostname {HOSTS['10.231.0.1']} && exec \"$@\"", "sh", sys.executable, "-m", "magmadnn_cli", *args]
        return subprocess.Popen(command, cwd=self.folder, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def train(self, *args: str) -> subprocess.CompletedProcess:
        """`magmadnn train c.yaml -q --processes 4 --hostfile HOSTFILE ARGS`, to its end."""
        p = self.start("train", "c.yaml", "-q", "--processes", "4", "--hostfile", str(self.hostfile), *args)
        stdout, stderr = p.communicate(timeout=240)
        return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)

    def pids(self) -> set[int]:
        return _pids(self.names[0]) | _pids(self.names[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    blobs_csv(folder / "blobs.csv", n=600)
    (folder / "c.yaml").write_text(CONFIG)
    made = Cluster(folder, str(os.getpid() % 10**6))
    try:
        made.create()
    except (RuntimeError, OSError) as exc:
        made.delete()
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield made
    finally:
        made.delete()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(name in left for name in made.names), f"namespaces left behind: {left}"


@pytest.fixture(scope="module")
def four_rank_run(cluster):
    out = cluster.folder / "four"
    done = cluster.train("--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


def _wait_for_checkpoint(out: Path, p: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while p.poll() is None and not list((out / "checkpoints").glob("step*.npz")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.poll() is None, f"the job ended before its first checkpoint: {p.communicate()[1]}"


def test_four_ranks_over_two_hosts_give_the_one_process_weights(cluster, four_rank_run):
    single = run_train(cluster.folder / "one", [], config=cluster.folder / "c.yaml")
    assert single.returncode == 0, single.stderr
    assert_same_weights(four_rank_run, cluster.folder / "one", 1e-5)
    assert "10.231.0.2" in (cluster.folder / "launched-on").read_text()  # hydra went through rsh.sh to node-b


def test_a_rank_killed_on_the_second_host_ends_the_job_with_nothing_left(cluster):
    out = cluster.folder / "killed"
    p = cluster.start("train", "c.yaml", "--out", str(out), "-q", "--processes", "4", "--hostfile",
                      str(cluster.hostfile), "--set", "training.epochs=2000",
                      "--set", "training.checkpoint.every_steps=1")
    _wait_for_checkpoint(out, p)
    job = cluster.pids() | job_processes(p.pid)
    ranks = [pid for pid in _pids(cluster.names[1]) if b"magmadnn_cli" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(ranks) == 2, f"expected 2 ranks on the second host, found {ranks}"
    start = time.monotonic()
    os.kill(ranks[0], signal.SIGKILL)
    p.communicate(timeout=60)
    ended = time.monotonic() - start
    assert p.returncode != 0
    assert not wait_until_gone(job | cluster.pids()), "a process of the job outlived it"
    assert ended < 30, f"the job took {ended:.1f} s to end after a rank died"


def test_sigterm_to_the_launcher_checkpoints_and_resume_is_bit_identical(cluster, four_rank_run):
    out = cluster.folder / "stopped"
    p = cluster.start("train", "c.yaml", "--out", str(out), "-q", "--processes", "4", "--hostfile",
                      str(cluster.hostfile), "--set", "training.checkpoint.every_steps=1")
    _wait_for_checkpoint(out, p)
    job = cluster.pids() | job_processes(p.pid)
    p.send_signal(signal.SIGTERM)  # the launcher alone, as a scheduler does
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert "stopped by SIGTERM" in err and f"--hostfile {cluster.hostfile}" in err and "--resume" in err, err
    assert not wait_until_gone(job | cluster.pids()), "a process of the job outlived the launcher"
    done = cluster.train("--set", "training.checkpoint.every_steps=1", "--resume", str(out))
    assert done.returncode == 0, done.stderr
    got, want = saved_weights(out), saved_weights(four_rank_run)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def _table(pids: set[int]) -> str:
    """`ps` lines of `pids` still there (what a failing test shows)."""
    done = subprocess.run(["ps", "-o", "pid,ppid,stat,etimes,args", "-p", ",".join(map(str, pids)) or "1"],
                          capture_output=True, text=True, timeout=30)
    return done.stdout


def _end_within(p: subprocess.Popen, job: set[int], seconds: float) -> str:
    """The job's stderr once it ended (within `seconds`); else every process is killed and the test fails."""
    try:
        return p.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        left = _table(job)
        for pid in job:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pytest.fail(f"the job still ran {seconds:g} s later:\n{left}\n{p.communicate()[1]}")


def _timed_run(cluster: Cluster, name: str) -> tuple[subprocess.Popen, set[int], list[int]]:
    """A long run with a 3 s `distributed.timeout`, past its first checkpoint: (launcher, the job's
    processes, the ranks on the second host)."""
    out = cluster.folder / name
    p = cluster.start("train", "c.yaml", "--out", str(out), "-q", "--processes", "4", "--hostfile",
                      str(cluster.hostfile), "--set", "training.epochs=2000", "--set", "distributed.timeout=3",
                      "--set", "training.checkpoint.every_steps=1")
    _wait_for_checkpoint(out, p)
    ranks = [pid for pid in _pids(cluster.names[1]) if b"magmadnn_cli" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(ranks) == 2, f"expected 2 ranks on the second host, found {ranks}"
    return p, cluster.pids() | job_processes(p.pid), ranks


def test_the_collective_timeout_ends_a_job_whose_rank_on_the_second_host_is_stopped(cluster):
    """A SIGSTOPped rank on node-b (a frozen process) answers nothing: with a 3 s `distributed.timeout`
    the job ends, naming that rank and host, and no process is left on either host."""
    p, job, ranks = _timed_run(cluster, "frozen")
    environ = Path(f"/proc/{ranks[0]}/environ").read_bytes().split(b"\0")
    rank = next(int(v.split(b"=")[1]) for v in environ if v.startswith(b"PMI_RANK="))
    os.kill(ranks[0], signal.SIGSTOP)
    start = time.monotonic()
    err = _end_within(p, job | cluster.pids(), 60)
    assert p.returncode != 0 and f"rank {rank} on node-b stopped answering" in err and "--resume" in err, err
    assert not wait_until_gone(job | cluster.pids()), f"a process of the job outlived it:\n{_table(job)}"
    assert time.monotonic() - start < 30, err


def test_the_collective_timeout_ends_a_job_split_by_the_network(cluster):
    """node-b's link goes down mid-run: both sides time out; the job ends with nothing left on either
    host, saying which ranks stopped answering."""
    p, job, _ = _timed_run(cluster, "split")
    _ip("-n", cluster.names[1], "link", "set", cluster.links[1], "down")
    try:
        start = time.monotonic()
        err = _end_within(p, job | cluster.pids(), 90)
        assert p.returncode != 0 and "on node-b stopped answering" in err, err
        assert not wait_until_gone(job | cluster.pids(), 30), f"a process of the job outlived it:\n{_table(job)}"
        assert time.monotonic() - start < 60, err
    finally:
        _ip("-n", cluster.names[1], "link", "set", cluster.links[1], "up")
