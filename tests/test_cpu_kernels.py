"""OpenBLAS's kernels on AMD Zen 4: the Haswell set is asked for (faster float32 GEMMs there), before
numpy loads, unless the user chose; every process the tool starts runs the same kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from magmadnn_cli.core import cpu_kernels
from magmadnn_cli.core.blas import kernel_name


def _block(vendor: str, family: int, flags: str, processor: int = 0) -> str:
    return (f"processor\t: {processor}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\n"
            f"model name\t: some cpu\nflags\t\t: fpu sse2 avx2 fma {flags}\n\n")


ZEN4 = _block("AuthenticAMD", 25, "avx512f avx512bw avx512_bf16")


@pytest.mark.parametrize("cpuinfo, expected", [
    (ZEN4 + _block("AuthenticAMD", 25, "avx512f", 1), "Haswell"),
    (_block("AuthenticAMD", 25, "vaes"), None),  # Zen 3: no AVX-512, OpenBLAS already runs AVX2 kernels
    (_block("AuthenticAMD", 26, "avx512f"), None),  # Zen 5: full-width AVX-512, not measured here
    (_block("GenuineIntel", 6, "avx512f"), None),  # Skylake-X and later: the AVX-512 kernels are theirs
    (_block("AuthenticAMD", 25, "avx512fx"), None),  # a flag is a whole word
    ("", None),  # not Linux
])
def test_the_kernels_asked_for_depend_on_the_cpu(cpuinfo, expected):
    choice = cpu_kernels.preferred(cpuinfo)
    assert (choice[0] if choice else None) == expected


def test_a_choice_of_the_users_is_kept():
    environ = {"OPENBLAS_CORETYPE": "SkylakeX"}
    assert cpu_kernels.choose(environ, ZEN4) is None and environ == {"OPENBLAS_CORETYPE": "SkylakeX"}
    environ = {}
    assert cpu_kernels.choose(environ, ZEN4) == "Haswell" and environ["OPENBLAS_CORETYPE"] == "Haswell"
    assert "faster float32 GEMMs on AMD family 0x19" in cpu_kernels.describe(environ, "Haswell", ZEN4)
    assert cpu_kernels.describe({}, "Zen", _block("AuthenticAMD", 25, "")) == "Zen (OpenBLAS's own choice for this CPU)"


def test_a_rank_on_another_cpu_makes_its_own_choice():
    """mpiexec passes the launching host's environment to every host's ranks: the value this tool set
    on a Zen 4 host is not forced on an Intel host's ranks, and a Zen 4 rank chooses for itself."""
    launcher = {}
    cpu_kernels.choose(launcher, ZEN4)
    intel = dict(launcher)
    assert cpu_kernels.choose(intel, _block("GenuineIntel", 6, "avx512f")) is None and "OPENBLAS_CORETYPE" not in intel
    zen4 = dict(launcher)
    assert cpu_kernels.choose(zen4, ZEN4) == "Haswell" and zen4 == launcher
    user = {**launcher, "OPENBLAS_CORETYPE": "Zen"}  # the user's own, even beside an earlier mark
    assert cpu_kernels.choose(user, _block("GenuineIntel", 6, "avx512f")) is None and user["OPENBLAS_CORETYPE"] == "Zen"


def _loaded(env: dict[str, str]) -> str:
    code = "import magmadnn_cli, numpy; from magmadnn_cli.core.blas import kernel_name; print(kernel_name())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          check=True).stdout.strip()


@pytest.mark.skipif(kernel_name() is None, reason="numpy's BLAS here is not an OpenBLAS that names its kernels")
def test_a_process_loads_the_kernels_chosen_for_its_cpu():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    choice = cpu_kernels.preferred(cpu_kernels.cpuinfo())
    if choice is not None:  # Zen 4 (this project's CI machines): Haswell's kernels, in this process too
        assert _loaded(env) == "Haswell" and kernel_name() == "Haswell"
    assert _loaded({**env, "OPENBLAS_CORETYPE": "Sandybridge"}) == "Sandybridge"  # the user's choice stands


@pytest.mark.skipif(kernel_name() is None, reason="numpy's BLAS here is not an OpenBLAS that names its kernels")
def test_env_names_the_kernels_and_why():
    done = subprocess.run([sys.executable, "-m", "magmadnn_cli", "env", "--json"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "OPENBLAS_CORETYPE": "Sandybridge"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blas_kernels"] == "Sandybridge (OPENBLAS_CORETYPE=Sandybridge)"
