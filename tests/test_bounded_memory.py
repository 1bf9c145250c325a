"""Memory bounded by design (issue 26): one budget (the machine's free memory, the address-space
limit, the cgroup's limit) checked before allocating, by the network, the readers and the metrics.
Memory caps are real: the CLI runs in a subprocess under RLIMIT_AS."""

from __future__ import annotations

import gzip
import resource
import subprocess
import sys
import zlib

import numpy as np
import pytest

from conftest import BLOBS_CONFIG, ROOT, blobs_csv, run_cli

GiB = 1 << 30


def capped(cap: int, *args, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """`magmadnn ARGS` in a subprocess whose address space is limited to `cap` bytes."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return subprocess.run([sys.executable, "-m", "magmadnn_cli", *map(str, args)], cwd=cwd, preexec_fn=limit,
                          capture_output=True, text=True, timeout=timeout, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                                               "COLUMNS": "200"})


def project(folder, config: str = BLOBS_CONFIG):
    blobs_csv(folder / "blobs.csv")
    (folder / "c.yaml").write_text(config)
    return folder / "c.yaml"


def clean_refusal(done: subprocess.CompletedProcess, *expected: str) -> None:
    text = done.stdout + done.stderr
    assert done.returncode == 2, text
    assert "Traceback" not in text and "internal error" not in text and "MemoryError" not in text, text
    for part in expected:
        assert part in " ".join(text.split()), text


# -- the budget ----------------------------------------------------------------------------------
def test_the_budget_counts_the_address_space_limit():
    code = "from magmadnn_cli.core import backend as B; print(B.host_memory_available())"
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * GiB, 2 * GiB))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, preexec_fn=limit, capture_output=True, text=True,
                          timeout=60)
    assert 0 < int(done.stdout) < 2 * GiB, done.stdout + done.stderr


def _cgroup(tmp_path, lines, files):
    tmp_path.mkdir()
    (tmp_path / "cgroup").write_text("\n".join(lines) + "\n")
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    from magmadnn_cli.core import backend as B
    return B._cgroup_headroom(tmp_path / "cgroup", tmp_path / "fs")


def test_the_budget_counts_cgroup_limits_v2_and_v1(tmp_path):
    v2 = {"fs/job/memory.max": f"{4 * GiB}\n", "fs/job/memory.current": f"{3 * GiB}\n",
          "fs/job/memory.stat": f"anon 5\ninactive_file {GiB // 2}\n",
          "fs/job/step/memory.max": "max\n", "fs/job/step/memory.current": "100\n"}
    assert _cgroup(tmp_path / "a", ["0::/job/step"], v2) == 4 * GiB - (3 * GiB - GiB // 2)  # the parent's limit binds
    v1 = {"fs/memory/memory.limit_in_bytes": f"{2 * GiB}\n", "fs/memory/memory.usage_in_bytes": f"{GiB}\n"}
    assert _cgroup(tmp_path / "b", ["4:memory:/not/visible/here", "1:cpu:/x"], v1) == GiB  # a container's own root
    unlimited = {"fs/memory/memory.limit_in_bytes": "9223372036854771712\n"}
    assert _cgroup(tmp_path / "c", ["4:memory:/"], unlimited) is None
    assert _cgroup(tmp_path / "d", ["0::/"], {"fs/memory.max": "max\n"}) is None


def test_require_memory_names_the_budget_and_what_sets_it():
    from magmadnn_cli.core import backend as B
    from magmadnn_cli.errors import MagmaError
    with pytest.raises(MagmaError, match=r"would need 1024\.0 GiB of memory; .* GiB available to this process"):
        B.require_memory(1 << 40, "a test")


# -- the network -----------------------------------------------------------------------------------
def test_a_huge_layer_is_refused_under_an_address_space_limit(tmp_path):
    """units: 100000000 passed the check on MemAvailable and died of MemoryError under a 3 GiB cap."""
    config = project(tmp_path, BLOBS_CONFIG.replace("units: 16", "units: 100000000"))
    done = capped(3 * GiB, "validate", config, cwd=tmp_path)
    clean_refusal(done, "would need", "available to this process (its address-space limit, ulimit -v)")


@pytest.mark.parametrize("units", ["4611686018427387904"])
def test_layer_sizes_beyond_int64_are_refused_not_overflowed(units, capsys, tmp_path):
    config = project(tmp_path, BLOBS_CONFIG.replace("units: 16", f"units: {units}"))
    for command in ("validate", "train"):
        code, out, err = run_cli(capsys, command, config, "--out", tmp_path / "out") if command == "train" else \
            run_cli(capsys, command, config)
        assert code == 2 and "would need" in err and "Traceback" not in out + err, out + err


def test_initialisation_temporaries_are_counted(monkeypatch):
    """Weights are drawn in float64 on the host and copied into the float32 buffer: a model whose
    buffers (weights, gradients) fit but whose float64 draw does not is refused before drawing."""
    from magmadnn_cli.config.layers import DenseLayer
    from magmadnn_cli.core import backend as B
    from magmadnn_cli.errors import MagmaError
    from magmadnn_cli.nn.layers import build_layers
    from magmadnn_cli.nn.network import Network
    params = 1000 * 1000 + 1000
    monkeypatch.setattr(B, "host_memory_available", lambda: 14 * params)  # the 12 bytes once counted fit
    with pytest.raises(MagmaError, match=r"dense_0/kernel of shape \(1000, 1000\)\), with their gradients, would "
                                         r"need 15\.3 MiB of memory \(.*drawn in float64"):
        Network(build_layers([DenseLayer(type="dense", units=1000)]), (1000,))


def test_the_training_estimate_counts_the_evaluation_batch():
    from magmadnn_cli.config.layers import DenseLayer
    from magmadnn_cli.nn.layers import build_layers
    from magmadnn_cli.nn.network import Network
    net = Network(build_layers([DenseLayer(type="dense", units=100), DenseLayer(type="dense", units=3)]), (4,))
    base = net.training_bytes(16, 2)
    assert net.training_bytes(16, 2, eval_batch=16) == base  # evaluation reuses what training freed
    assert net.training_bytes(16, 2, eval_batch=1024) == base + (1024 - 16) * 103 * 4
