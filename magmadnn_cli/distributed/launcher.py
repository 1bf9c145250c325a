"""`--processes N|auto` [`--hostfile FILE` | `--hosts h1:4,h2:4`]: re-launch this command under the
mpiexec of the running Python environment, on the hosts given."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import EveryRankError, MagmaError
from ..processes import die_with_parent
from ..signals import CARRIERS, RELAY_VARIABLE, SIGNALS, relay_text
from .comm import launched_ranks, local_ranks
from .hosts import Layout, is_open_mpi, mpiexec_command, resolve_layout
from .leftovers import RUN_RECORD, record_path, segments, sweep

GUARD = "MAGMADNN_LAUNCHED"
TERMINAL = "MAGMADNN_TERMINAL"  # "1": the launcher's output is a terminal (the ranks' may be a pty all the same)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def locate_mpi_launcher() -> str:
    """The mpiexec next to sys.executable (the PyPI `mpich` runtime installs it there), else PATH."""
    for name in ("mpiexec", "mpirun"):
        beside = Path(sys.executable).parent / name
        if beside.exists():
            return str(beside)
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name)
        if found:
            return found
    raise MagmaError("--processes needs mpiexec: `pip install mpich` into this environment (magmadnn's "
                     "default install does), or put an MPI's mpiexec on PATH")


OURS = "MAGMADNN_BLAS_THREADS"  # set beside THREAD_VARS when this tool chose them (not the user)


def limit_blas_threads(ranks: int, env: dict[str, str] | os._Environ = os.environ) -> None:
    """About this rank's cores / the ranks on its node BLAS threads per rank, unless the user chose;
    before numpy loads (`ranks`: the launcher's word; MPI's shared-memory split refines it, `share_node_cores`)."""
    if not any(v in env for v in THREAD_VARS):
        threads = str(max(1, _cpus() // max(1, ranks)))
        for var in (*THREAD_VARS, OURS):
            env[var] = threads


def node_threads_ours(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether this tool chose the BLAS thread count (so it may change it once MPI knows the node)."""
    return OURS in env and all(env.get(v) == env[OURS] for v in THREAD_VARS)


def threads_per_rank(mine: set[int], node: list[set[int]]) -> int:
    """BLAS threads for a rank that may run on the CPUs `mine`, beside its node's ranks' CPUs `node`
    (itself included): its CPUs shared out among the ranks that may run on them (bound ranks keep theirs)."""
    sharing = sum(1 for cpus in node if cpus & mine) or 1
    return max(1, len(mine) // sharing)


def share_node_cores(local: Any) -> None:
    """Once MPI runs: set the BLAS threads from the ranks of this node (`local`, MPI's shared-memory
    split), unless the user chose them. Collective over `local`."""
    mine = _cpu_set()
    node = local.allgather(mine)
    if node_threads_ours():
        from ..core import blas  # numpy: after the limits above were set
        threads = threads_per_rank(mine, node)
        blas.set_threads(threads)
        for var in (*THREAD_VARS, OURS):
            os.environ[var] = str(threads)


def _cpu_set() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _cpus() -> int:
    return len(_cpu_set())


def max_processes() -> int:
    """More ranks than this need --oversubscribe: 4 per core (at least 8)."""
    return max(8, 4 * (os.cpu_count() or 1))


def _said(asked_by: str, processes: int) -> str:
    """`asked_by` (a place, `{}` for the count) with the count written in."""
    return asked_by.replace("{}", str(processes))


def check_processes(processes: int, oversubscribe: bool, asked_by: str = "--processes {}") -> None:
    """`asked_by`: where the count came from, as the user wrote it, `{}` for the count ("--processes {}",
    "c.yaml:12: distributed.processes: {}", "--set distributed.processes={}")."""
    if processes > max_processes() and not oversubscribe:
        raise MagmaError(f"{_said(asked_by, processes)}: this machine has {os.cpu_count()} cores, so more than "
                         f"{max_processes()} ranks would mostly wait for each other (and each holds its own copy of "
                         "the data); use fewer, or add --oversubscribe if you mean it")


def _die_with_parent(sig: int) -> Callable[[], None]:
    """For the child, before exec: receive `sig` when the launcher dies, even by SIGKILL (Linux)."""
    def arrange() -> None:
        die_with_parent(sig)
    return arrange


def check_layout(layout: Layout, oversubscribe: bool, asked_by: str) -> None:
    """More ranks than the hosts' slots (or the Slurm allocation's tasks, or 4 per core here) are
    refused without --oversubscribe: they would mostly wait for each other."""
    if oversubscribe:
        return
    if layout.hosts and layout.processes > layout.slots:
        listed = ", ".join(f"{host}:{slots}" for host, slots in layout.hosts[:4]) + (", ..." * (len(layout.hosts) > 4))
        raise MagmaError(f"{_said(asked_by, layout.processes)}: the hosts of {layout.hosts_flag} offer "
                         f"{layout.slots} slots ({listed}); use --processes auto ({layout.slots}), more slots, or --oversubscribe")
    if not layout.hosts and layout.allocation and layout.processes > layout.allocation:
        raise MagmaError(f"{_said(asked_by, layout.processes)}: this Slurm allocation has {layout.allocation} "
                         "tasks; use --processes auto, ask sbatch for more (--ntasks), or add --oversubscribe")
    if not layout.hosts and not layout.allocation:
        check_processes(layout.processes, oversubscribe, asked_by)


def processes_origin(cfg: Any, config: Path) -> str:
    """Where distributed.processes was set, as the user wrote it, `{}` for the count (`check_layout`)."""
    origin = cfg.where("distributed", "processes") or str(config)
    return "--set distributed.processes={}" if origin.startswith("--set") else f"{origin}: distributed.processes: {{}}"


def ranks_asked(processes: str | None, hostfile: Path | None, hosts: str | None, oversubscribe: bool,
                configured: int) -> int:
    """How many ranks this command runs on: its launcher's, or what the options (or the config's
    `configured` count) ask for; 1 for this process alone."""
    if launched_ranks():
        return launched_ranks()
    layout = resolve_layout(processes, hostfile, hosts, configured)
    return layout.processes if layout.processes > 1 or layout.hosts else 1


def relaunch(processes: str | None, hostfile: Path | None, hosts: str | None, oversubscribe: bool,
             configured: int, config_key: str) -> int | None:
    """Start this command under mpiexec when the options (or the config's `configured` count, named
    `config_key` in messages) ask for ranks or hosts: the job's exit code; None where this process
    runs the command itself."""
    if os.environ.get(GUARD):
        return None  # a rank of our own launch: the layout is in place
    if launched_ranks():  # started by mpiexec or srun: theirs decides
        _check_external(launched_ranks(), processes, hostfile, hosts)
        return None
    layout = resolve_layout(processes, hostfile, hosts, configured)
    if layout.processes <= 1 and not layout.hosts:
        return None
    check_layout(layout, oversubscribe, "--processes {}" if processes is not None else config_key)
    code = launch(layout, sys.argv[1:])
    if code == HYDRA_LAUNCH_FAILED and layout.hosts:  # the ranks' own codes are 0-2 and 128 + a signal
        raise LaunchFailed(f"mpiexec could not start the ranks on every host (exit 255; its lines above name the "
                          f"host): each host of {layout.hosts_flag} ({', '.join(h for h, _ in layout.hosts)}) must "
                          "resolve from here and take passwordless ssh, with this Python environment, the config and "
                          "the data at the same paths (docs/clusters.md, 'A way in')")
    return code


def _check_external(ranks: int, processes: str | None, hostfile: Path | None, hosts: str | None) -> None:
    """Under another's mpiexec or srun, options asking for other ranks or hosts are refused (every
    rank raises it): they would be ignored without a word."""
    asked = (f"--processes {processes}" if processes not in (None, "auto") and processes != str(ranks) else
             "--hostfile" if hostfile is not None else "--hosts" if hosts is not None else None)
    if asked:
        raise EveryRankError(f"{asked}: this process is one of {ranks} ranks that mpiexec or srun started: its -n decides "
                          f"the ranks and hosts; drop {asked.split()[0]}, or start the job with the layout you want")


HYDRA_LAUNCH_FAILED = 255  # hydra's exit when it cannot start or reach a host's proxy
KILLING = {signal.SIGABRT, signal.SIGBUS, signal.SIGKILL, signal.SIGSEGV}  # hydra exits with the signal's number
                                                                         # (returned as 128 + it, as a shell says)


class JobEnded(MagmaError):
    """The job ended as a killed rank ended it (exit 128 + the signal)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code


class LaunchFailed(MagmaError):
    exit_code = HYDRA_LAUNCH_FAILED


def launch(layout: Layout, argv: list[str]) -> int:
    """Run `magmadnn <argv>` as `layout` says; returns the job's exit code. Stop signals (SIGINT,
    SIGTERM, SIGUSR1) sent to this launcher are passed on to mpiexec (Open MPI's as their carriers,
    `signals.CARRIERS`), which passes them to every rank, so they write a checkpoint and stop; the
    launcher waits for the job to end (`_wait`): it never leaves ranks behind, nor the shared memory
    of ranks that were killed (`leftovers`). A rank killed by a signal gives 128 + it. The ranks get
    `argv` whole, so the resume hint repeats the layout as it was given."""
    mpiexec = locate_mpi_launcher()
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    carriers = CARRIERS if is_open_mpi(version) else {}  # its mpirun kills on SIGINT/SIGTERM: see signals
    before = segments()
    job, relays = _start(mpiexec_command(mpiexec, version, layout, argv), carriers)
    stops: list[tuple[int, float]] = []  # the stop signals passed on, and when

    def forward(signum: int, frame: object) -> None:
        stops.append((signum, time.monotonic()))
        job.send_signal(carriers.get(signum, signum))

    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    code, forced = None, False
    try:
        code = _wait(job, stops)
        return 128 + code if code in KILLING else code
    except JobForced:
        forced = True  # the job is gone and this process only says so: a further stop must not cut that short
        raise
    finally:
        if code != 0:  # killed ranks never unlinked their shared memory
            sweep(before)
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if forced else handler)
        for relay in relays:
            relay.join(RELAY_DRAIN)


def _start(command: list[str], carriers: dict[int, int]) -> tuple[subprocess.Popen, list["_Relay"]]:
    """mpiexec started in a session of its own (a terminal's Ctrl-C reaches the job once, through the
    launcher, not twice), told it runs under this launcher; and the threads relaying its output."""
    env = dict(os.environ, **{GUARD: "1", TERMINAL: "1" if sys.stdout.isatty() else "0", RUN_RECORD: str(record_path())},
               **({RELAY_VARIABLE: relay_text(carriers)} if carriers else {}))
    piped = {name: subprocess.PIPE if _is_pipe(getattr(sys, name)) else None for name in ("stdout", "stderr")}
    for stream in (sys.stdout, sys.stderr):  # what this process printed goes before the job's output
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    job = subprocess.Popen(command, env=env, start_new_session=True,
                           preexec_fn=_die_with_parent(carriers.get(signal.SIGTERM, signal.SIGTERM))
                           if sys.platform == "linux" else None, **piped)
    relays = [_Relay(source, getattr(sys, name)) for name, source in (("stdout", job.stdout), ("stderr", job.stderr))
              if source is not None]
    for relay in relays:
        relay.start()
    return job, relays


RELAY_DRAIN = 10.0  # seconds to pass on what the job wrote last, once it has ended
LONELY = 15.0  # seconds mpiexec may run with no process of its own (proxy, rank, srun) before it is ended


FORCE_AFTER = 10.0  # seconds a job may go on after a second stop signal before every process of it is killed


class JobForced(MagmaError):
    """The job outlived a second stop signal by FORCE_AFTER s (its ranks inside MPI, or starting it, where
    signals wait): every process of it on this host was killed (hydra's proxies then end the others)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.exit_code = signum, 128 + signum


def _wait(job: subprocess.Popen, stops: list[tuple[int, float]] | None = None) -> int:
    """The job's exit code, once mpiexec ends. An mpiexec left with no process of its own for LONELY s
    (its proxies, ranks or srun gone) is ended: under Slurm, hydra's proxies exit when a node's name
    does not resolve, and mpiexec would wait for them until the job's time limit. A job still running
    FORCE_AFTER s after a second stop signal is killed (`JobForced`)."""
    alone_since, stops = None, stops if stops is not None else []
    while True:
        try:
            return job.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if len(stops) >= 2 and time.monotonic() - stops[1][1] > FORCE_AFTER:
            _kill_tree(job.pid)
            job.wait()
            raise JobForced(stops[-1][0])
        children = _children(job.pid)  # None: not known, never judged alone
        alone_since = None if children is None or children else alone_since or time.monotonic()
        if alone_since is not None and time.monotonic() - alone_since > LONELY:
            job.kill()
            job.wait()
            raise LaunchFailed(f"mpiexec has had no proxy or rank left for {LONELY:g} s and did not end; the job is "
                               "ended. Its lines above say why; under Slurm, hydra's proxies exit when the allocation's "
                               "node names do not resolve on every node (docs/clusters.md)")


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (found first, then killed: none escapes by re-parenting),
    and its process group (the job's session: where /proc lists no children)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(_children(found[-1]) or ())
    for process in found:
        with contextlib.suppress(OSError):
            os.kill(process, signal.SIGKILL)


def _children(pid: int) -> set[int] | None:
    """The processes whose parent is `pid` (None where /proc cannot tell: then nobody is judged alone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return {int(c) for t in tasks for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()}
    except (OSError, ValueError):
        return None


def _is_pipe(stream: Any) -> bool:
    """Whether `stream` is a pipe or socket: a reader that may go away (`| head`)."""
    try:
        return stat.S_ISFIFO(mode := os.fstat(stream.fileno()).st_mode) or stat.S_ISSOCK(mode)
    except (AttributeError, OSError, ValueError):
        return False


class _Relay(threading.Thread):
    """Passes the job's output on to this launcher's pipe; once that pipe's reader has gone, reads on
    and drops it, so the job never writes into a closed pipe (mpiexec dies of SIGPIPE, and its ranks
    with it, mid-run) and finishes as one process does."""

    def __init__(self, source: Any, sink: Any) -> None:
        super().__init__(name="magmadnn-relay", daemon=True)
        self.source, self.sink = source, sink

    def run(self) -> None:
        reader_there, fd = True, self.sink.fileno()
        with self.source:
            while chunk := os.read(self.source.fileno(), 1 << 16):
                while reader_there and chunk:
                    try:
                        chunk = chunk[os.write(fd, chunk):]
                    except OSError:  # EPIPE: the reader went away
                        reader_there = False


def output_is_terminal(ranks: int) -> bool:
    """Whether this process's output reaches a person's terminal (a live progress display): its stdout
    is one and, under ranks, so was the launcher's (Open MPI gives every rank a pty even when the job's
    output goes to a file; ranks launched by another's mpirun show no live display)."""
    return sys.stdout.isatty() and (ranks <= 1 or os.environ.get(TERMINAL) == "1")


def before_numpy() -> None:
    """Called first thing in the entry point: BLAS thread limits for ranks started by any launcher
    (one process keeps the BLAS's own choice)."""
    if launched_ranks() > 1:
        limit_blas_threads(local_ranks())
