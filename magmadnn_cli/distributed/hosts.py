"""Where `--processes` puts its ranks: `--hostfile FILE` (hydra's `host:slots` or Open MPI's `host
slots=N` a line, `#` comments, blank lines) or `--hosts h1:4,h2:4`; `auto` counts every slot of the hosts
given, else the tasks of the Slurm allocation this runs inside (`sbatch`, `salloc`), else this
machine's cores. Slurm's compressed lists (`node[01-03,07]`, `2(x3),1`) are expanded here, without
scontrol. Also the mpiexec command line that starts the layout."""

from __future__ import annotations

import itertools
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import MagmaError

Hosts = list[tuple[str, int]]
_ENTRY = re.compile(r"([A-Za-z0-9_.\-]+)(?::([0-9]+)|\s+slots\s*=\s*([0-9]+)(?:\s+max[_-]slots\s*=\s*[0-9]+)?)?")
_EXAMPLE = ("expected `host`, `host:slots` or `host slots=N` (slots a whole number from 1 to 65536), as in "
            "`node01:4` or `node01 slots=4`")


@dataclass
class Layout:
    """How many ranks, on which hosts (none: this machine, or the allocation hydra finds itself)."""
    processes: int
    hosts: Hosts = field(default_factory=list)
    hostfile: Path | None = None  # the file as the user gave it (for the resume hint)
    allocation: int | None = None  # the Slurm allocation's tasks, when inside one and no hosts were given

    @property
    def slots(self) -> int:
        return sum(slots for _, slots in self.hosts)

    @property
    def hosts_flag(self) -> str:
        return f"--hostfile {self.hostfile}" if self.hostfile is not None else "--hosts"


MAX_SLOTS = 65536  # ranks a host may take (hydra fails on a count past its rank map with an assertion)


def _entry(text: str) -> tuple[str, int] | None:
    """(host, slots) of `host`, hydra's `host:slots` or Open MPI's `host slots = N [max_slots=M]`."""
    match = _ENTRY.fullmatch(text.strip())
    slots = int(match.group(2) or match.group(3) or 1) if match else 0
    return (match.group(1), slots) if match and 1 <= slots <= MAX_SLOTS else None


MAX_HOSTFILE_BYTES = 16 << 20  # a line per host: a million hosts fit
MAX_NODES = 1_000_000  # hosts a Slurm list may name (the largest machines have some 160,000 nodes)


def _hostfile_lines(path: Path) -> list[str]:
    """A hostfile's lines, read within MAX_HOSTFILE_BYTES (a device such as /dev/zero, or a huge file,
    is refused by size, never read whole)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_HOSTFILE_BYTES + 1)
    except FileNotFoundError:
        raise MagmaError(f"--hostfile {path}: not found; give a file of `host:slots` lines") from None
    except OSError as exc:
        raise MagmaError(f"--hostfile {path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_HOSTFILE_BYTES:
        raise MagmaError(f"--hostfile {path}: larger than {MAX_HOSTFILE_BYTES >> 20} MiB (a device, or not a "
                         "hostfile?); a hostfile names the hosts, one `host:slots` a line")
    if b"\0" in raw:
        raise MagmaError(f"--hostfile {path}: holds binary data (NUL bytes), not `host:slots` lines")
    try:
        return raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise MagmaError(f"--hostfile {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_hostfile(path: Path) -> Hosts:
    """The hosts of a hostfile in hydra's or Open MPI's format (`#` starts a comment); a host named
    twice takes the slots of both; a malformed line is named by file and line."""
    lines = _hostfile_lines(path)
    hosts: Hosts = []
    for number, line in enumerate(lines, 1):
        text = line.partition("#")[0]
        if not text.strip():
            continue
        entry = _entry(text)
        if entry is None:
            raise MagmaError(f"{path}:{number}: {_EXAMPLE}; received {shorten(line.strip())}")
        hosts.append(entry)
    if not hosts:
        raise MagmaError(f"--hostfile {path}: names no host; write one `host:slots` a line, as in `node01:4`")
    return _merged(hosts)


def _merged(hosts: Hosts) -> Hosts:
    """One entry a host, in the order of first mention, with the slots of all its mentions."""
    slots: dict[str, int] = {}
    for host, count in hosts:
        slots[host] = slots.get(host, 0) + count
    return list(slots.items())


def parse_hosts(text: str) -> Hosts:
    """`--hosts h1:4,h2:4` (a host without slots has 1; one named twice, the slots of both)."""
    parts = text.split(",")
    hosts = [_entry(part) for part in parts]
    for part, entry in zip(parts, hosts):
        if entry is None:
            raise MagmaError(f"--hosts: {part.strip()!r}: {_EXAMPLE}, comma-separated: --hosts node01:4,node02:4")
    return _merged(hosts)  # type: ignore[arg-type]


def _items(text: str) -> list[list[str]]:
    """Each host pattern of a Slurm list as its pieces: literal, range list, literal, ..."""
    return [re.split(r"\[([^\]]*)\]", item) for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text)]


def count_nodelist(text: str) -> int:
    """How many hosts a Slurm list names, counted without writing them out; more than MAX_NODES is
    refused (no allocation is that large: the variable is not Slurm's)."""
    total = sum(math.prod(_range_count(p, text) for p in pieces[1::2]) for pieces in _items(text))
    if total > MAX_NODES:
        raise MagmaError(f"SLURM_JOB_NODELIST {shorten(text)}: names {total:,} hosts, more than any allocation "
                         f"({MAX_NODES:,} at most); it was not set by Slurm: unset it, or fix it")
    return total


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list (`SLURM_JOB_NODELIST`): `gpu[01-03,07],cpu1` -> each host."""
    count_nodelist(text)  # bounded before a name is written
    names: list[str] = []
    for pieces in _items(text):
        choices = [[p] if i % 2 == 0 else _expand_ranges(p, text) for i, p in enumerate(pieces)]
        names += ["".join(combo) for combo in itertools.product(*choices)]
    return names


def _bounds(part: str, whole: str) -> tuple[str, int, int]:
    low, _, high = part.partition("-")
    if not low.isdigit() or (high and not high.isdigit()) or max(len(low), len(high)) > 18:
        raise MagmaError(f"SLURM_JOB_NODELIST {shorten(whole)}: cannot read the range {shorten(part)}")
    return low, int(low), int(high or low)


def _range_count(ranges: str, whole: str) -> int:
    return sum(max(0, end - start + 1) for _, start, end in (_bounds(p, whole) for p in ranges.split(",")))


def _expand_ranges(ranges: str, whole: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        low, start, end = _bounds(part, whole)
        out += [str(n).zfill(len(low)) for n in range(start, end + 1)]
    return out


def shorten(text: str, limit: int = 60) -> str:
    """`text` quoted, cut to `limit` characters with its length said."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


def _task_counts(text: str) -> list[tuple[int, int]]:
    """Slurm's `SLURM_TASKS_PER_NODE` as (tasks, nodes) pairs: `2(x3),1` -> [(2, 3), (1, 1)]."""
    pairs = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise MagmaError(f"SLURM_TASKS_PER_NODE {shorten(text)}: expected counts like 2(x3),1; cannot read "
                             f"{shorten(part)}")
        pairs.append((int(match.group(1)), int(match.group(2) or 1)))
    if sum(nodes for _, nodes in pairs) > MAX_NODES:
        raise MagmaError(f"SLURM_TASKS_PER_NODE {shorten(text)}: counts more than {MAX_NODES:,} nodes; it was not "
                         "set by Slurm: unset it, or fix it")
    return pairs


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's `SLURM_TASKS_PER_NODE`: `2(x3),1` -> [2, 2, 2, 1]."""
    return [tasks for tasks, nodes in _task_counts(text) for _ in range(nodes)]


def _int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "")
    return int(value) if value.isdigit() else None


def slurm_tasks(env: Mapping[str, str] = os.environ) -> int | None:
    """The tasks of the Slurm allocation this process runs in (None: not inside one): SLURM_NTASKS, else
    the sum of SLURM_TASKS_PER_NODE, else every CPU of every node."""
    if "SLURM_JOB_ID" not in env:
        return None
    if _int(env, "SLURM_NTASKS"):
        return _int(env, "SLURM_NTASKS")
    if env.get("SLURM_TASKS_PER_NODE"):
        return sum(tasks * nodes for tasks, nodes in _task_counts(env["SLURM_TASKS_PER_NODE"]))
    nodes = _int(env, "SLURM_JOB_NUM_NODES") or count_nodelist(env.get("SLURM_JOB_NODELIST", ""))
    return max(1, nodes) * (_int(env, "SLURM_CPUS_ON_NODE") or _cores())


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _count(processes: str) -> int | None:
    """`--processes` as a number; None for auto."""
    if processes.strip().lower() == "auto":
        return None
    if not processes.strip().isdigit() or int(processes) < 1:
        raise MagmaError(f"--processes: expected a whole number of ranks (1 or more) or auto; received {processes!r}")
    return int(processes)


def resolve_layout(processes: str | None, hostfile: Path | None, hosts: str | None, configured: int,
                   env: Mapping[str, str] = os.environ) -> Layout:
    """The layout the options ask for. Hosts without --processes: the config's count if it sets one
    above 1, else every slot; `auto`: every slot of the hosts, else the Slurm allocation, else the cores."""
    if hostfile is not None and hosts is not None:
        raise MagmaError("--hostfile and --hosts both name the hosts; give one")
    listed = read_hostfile(hostfile) if hostfile is not None else parse_hosts(hosts) if hosts is not None else []
    count = _count(processes) if processes is not None else (configured if configured > 1 or not listed else None)
    allocation = slurm_tasks(env) if not listed else None
    if count is None:
        count = sum(slots for _, slots in listed) if listed else allocation or _cores()
    return Layout(count, listed, hostfile, allocation)


def mpiexec_command(mpiexec: str, version: str, layout: Layout, argv: list[str]) -> list[str]:
    """`mpiexec [hosts] -n N python -m magmadnn_cli ARGV`, the hosts as hydra's `-hosts h:slots,...`
    or Open MPI's `--host h:slots,...` (whichever format the hostfile was in)."""
    flags: list[str] = []
    if is_open_mpi(version):
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
        if layout.hosts:
            flags += ["--host", ",".join(f"{host}:{slots}" for host, slots in layout.hosts)]
    elif layout.hosts:  # hydra's -hosts: a hostfile may be in Open MPI's format, which `-f` cannot read
        flags = ["-hosts", ",".join(f"{host}:{slots}" for host, slots in layout.hosts)]
    return [mpiexec, *flags, "-n", str(layout.processes), sys.executable, "-m", "magmadnn_cli", *argv]


def is_open_mpi(version: str) -> bool:
    """Whether `mpiexec --version` printed `version` for Open MPI's launcher (else hydra's, or another)."""
    return "Open MPI" in version or "OpenRTE" in version
