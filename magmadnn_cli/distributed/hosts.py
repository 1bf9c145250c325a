"""Where `--processes` puts its ranks: `--hostfile FILE` (hydra's format: `host` or `host:slots` a line,
whole-line `#` comments, blank lines) or `--hosts h1:4,h2:4`; `auto` counts every slot of the hosts
given, else the tasks of the Slurm allocation this runs inside (`sbatch`, `salloc`), else this
machine's cores. Slurm's compressed lists (`node[01-03,07]`, `2(x3),1`) are expanded here, without
scontrol. Also the mpiexec command line that starts the layout."""

from __future__ import annotations

import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..errors import MagmaError

Hosts = list[tuple[str, int]]
_ENTRY = re.compile(r"([A-Za-z0-9_.\-]+)(?::([0-9]+))?")
_EXAMPLE = "expected `host` or `host:slots` (slots a whole number, 1 or more), as in `node01:4`"


@dataclass
class Layout:
    """How many ranks, on which hosts (none: this machine, or the allocation hydra finds itself)."""
    processes: int
    hosts: Hosts = field(default_factory=list)
    hostfile: Path | None = None  # the file as the user gave it (hydra reads it itself with -f)
    allocation: int | None = None  # the Slurm allocation's tasks, when inside one and no hosts were given

    @property
    def slots(self) -> int:
        return sum(slots for _, slots in self.hosts)

    @property
    def hosts_flag(self) -> str:
        return f"--hostfile {self.hostfile}" if self.hostfile is not None else "--hosts"


def _entry(text: str) -> tuple[str, int] | None:
    match = _ENTRY.fullmatch(text.strip())
    slots = int(match.group(2) or 1) if match else 0
    return (match.group(1), slots) if match and slots >= 1 else None


def read_hostfile(path: Path) -> Hosts:
    """The hosts of a hydra hostfile; a malformed line is named by file and line."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise MagmaError(f"--hostfile {path}: not found; give a file of `host:slots` lines") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MagmaError(f"--hostfile {path}: cannot be read ({exc})") from None
    hosts: Hosts = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.strip().startswith("#"):
            continue
        entry = _entry(line)
        if entry is None:
            comment = " A comment takes a whole line (start it with #)." if "#" in line else ""
            raise MagmaError(f"{path}:{number}: {_EXAMPLE}; received {line.strip()!r}.{comment}")
        hosts.append(entry)
    if not hosts:
        raise MagmaError(f"--hostfile {path}: names no host; write one `host:slots` a line, as in `node01:4`")
    return hosts


def parse_hosts(text: str) -> Hosts:
    """`--hosts h1:4,h2:4` (a host without slots has 1)."""
    parts = text.split(",")
    hosts = [_entry(part) for part in parts]
    for part, entry in zip(parts, hosts):
        if entry is None:
            raise MagmaError(f"--hosts: {part.strip()!r}: {_EXAMPLE}, comma-separated: --hosts node01:4,node02:4")
    return hosts  # type: ignore[return-value]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list (`SLURM_JOB_NODELIST`): `gpu[01-03,07],cpu1` -> each host."""
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        pieces = re.split(r"\[([^\]]*)\]", item)  # literal, range list, literal, ...
        choices = [[p] if i % 2 == 0 else _expand_ranges(p, text) for i, p in enumerate(pieces)]
        names += ["".join(combo) for combo in itertools.product(*choices)]
    return names


def _expand_ranges(ranges: str, whole: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise MagmaError(f"SLURM_JOB_NODELIST {whole!r}: cannot read the range {part!r}")
        out += [str(n).zfill(len(low)) for n in range(int(low), int(high or low) + 1)]
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's `SLURM_TASKS_PER_NODE`: `2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise MagmaError(f"SLURM_TASKS_PER_NODE {text!r}: expected counts like 2(x3),1; cannot read {part!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


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
        return sum(expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"]))
    nodes = _int(env, "SLURM_JOB_NUM_NODES") or len(expand_nodelist(env.get("SLURM_JOB_NODELIST", "")))
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
    """`mpiexec [hosts] -n N python -m magmadnn_cli ARGV`: hydra reads the hostfile itself (`-f`) or
    takes `-hosts`; Open MPI takes `--host h:slots,...` (its hostfile format differs)."""
    flags: list[str] = []
    if is_open_mpi(version):
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
        if layout.hosts:
            flags += ["--host", ",".join(f"{host}:{slots}" for host, slots in layout.hosts)]
    elif layout.hostfile is not None:
        flags = ["-f", str(Path(layout.hostfile).resolve())]
    elif layout.hosts:
        flags = ["-hosts", ",".join(f"{host}:{slots}" for host, slots in layout.hosts)]
    return [mpiexec, *flags, "-n", str(layout.processes), sys.executable, "-m", "magmadnn_cli", *argv]


def is_open_mpi(version: str) -> bool:
    """Whether `mpiexec --version` printed `version` for Open MPI's launcher (else hydra's, or another)."""
    return "Open MPI" in version or "OpenRTE" in version
