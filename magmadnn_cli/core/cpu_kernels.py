"""Which kernel set numpy's bundled OpenBLAS loads, chosen once, before numpy is imported.

OpenBLAS's DYNAMIC_ARCH builds (numpy's PyPI wheels) pick their kernels by CPU when the library
loads, and nothing changes them afterwards. On AMD Zen 4 (family 0x19 with AVX-512) they pick
SkylakeX's AVX-512 kernels; Zen 4 runs a 512-bit operation as two 256-bit halves, and the Haswell
(AVX2) kernels run float32 GEMMs 4-17% faster there (the paper MLP's training step 0.94x;
`benchmarks/blas_kernels.py`, docs/performance.md; float64 is mixed). float32 is the default, so on
such a CPU the Haswell kernels are asked for, through OpenBLAS's own `OPENBLAS_CORETYPE`.
A value the user set is kept, and so is OpenBLAS's choice on any other CPU. A launcher passes the
environment on to every rank, on other hosts too: `MARK` says the value was this tool's, so a rank
on another kind of CPU makes its own choice rather than inherit the launching host's.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, MutableMapping

VARIABLE = "OPENBLAS_CORETYPE"
MARK = "MAGMADNN_OPENBLAS_CORETYPE"  # the value this tool set (absent: any OPENBLAS_CORETYPE is the user's)
ZEN4 = "AMD family 0x19 with AVX-512"


def preferred(cpuinfo: str) -> tuple[str, str] | None:
    """(the OpenBLAS core type to ask for, the CPU it is asked for) from /proc/cpuinfo's text, or
    None where OpenBLAS's own choice stands."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:  # the first processor's block is enough: every core is the same model
                break
            continue
        fields.setdefault(key.strip(), value.strip())
    amd = fields.get("vendor_id") == "AuthenticAMD"
    if amd and fields.get("cpu family") == "25" and "avx512f" in fields.get("flags", "").split():
        return "Haswell", ZEN4
    return None


def choose(environ: MutableMapping[str, str], cpuinfo: str) -> str | None:
    """Set `OPENBLAS_CORETYPE` in `environ` where this CPU is better served than by OpenBLAS's own
    choice and the user set none (a value this tool set on another host is replaced by this CPU's
    choice, or removed); returns the core type set (None: nothing set)."""
    ours = environ.get(MARK)
    if VARIABLE in environ and environ[VARIABLE] != ours:
        return None
    environ.pop(VARIABLE, None)
    environ.pop(MARK, None)
    choice = preferred(cpuinfo)
    if choice is None:
        return None
    environ[VARIABLE] = environ[MARK] = choice[0]
    return choice[0]


def choose_for_this_process() -> str | None:
    """`choose` for this process and what it starts: only before numpy (and its OpenBLAS) is loaded,
    so that this process runs the kernels its ranks will."""
    if "numpy" in sys.modules:
        return None
    return choose(os.environ, cpuinfo())


def cpuinfo() -> str:
    """/proc/cpuinfo's first 64 KiB (enough for the first processor's block); '' off Linux."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return ""


def describe(environ: Mapping[str, str], loaded: str | None, cpuinfo: str) -> str:
    """What `magmadnn env` says of the kernels: the ones loaded, and why."""
    name = loaded or "unknown (not OpenBLAS, or an OpenBLAS that does not say)"
    choice = preferred(cpuinfo)
    if VARIABLE in environ and choice is not None and environ[VARIABLE] == choice[0]:
        return f"{name} ({VARIABLE}={environ[VARIABLE]}: faster float32 GEMMs on {choice[1]})"
    if VARIABLE in environ:
        return f"{name} ({VARIABLE}={environ[VARIABLE]})"
    return f"{name} (OpenBLAS's own choice for this CPU)"
