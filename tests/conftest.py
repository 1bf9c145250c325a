"""Shared test helpers: float64 finite-difference gradient checks and backend reset."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import magmadnn_cli  # noqa: F401  first: it chooses OpenBLAS's kernels before numpy loads them, as the ranks it starts do
import numpy as np
import pytest

from magmadnn_cli.core import backend as B

# what runs started by the suite cache (decoded images) goes to a temp folder, not the user's ~/.cache
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="magmadnn-test-cache-")
from magmadnn_cli.core.graph import Graph, Node, Variable
from magmadnn_cli.core.graph import ops


@pytest.fixture
def float64():
    """The test runs on the CPU in float64 (the backend outside any run is the CPU in float32)."""
    with B.using(B.cpu("float64")):
        yield


def numerical_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of scalar f with respect to every element of x (modified in place)."""
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        plus = f()
        x[i] = old - eps
        minus = f()
        x[i] = old
        grad[i] = (plus - minus) / (2 * eps)
    return grad


def check_op_grads(build: Callable[..., Node], *arrays: np.ndarray, seed: int = 0,
                   rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """Build `build(*variables)`, reduce it with a random weighting to a scalar, and compare the
    autodiff gradient of every input with central differences (float64)."""
    variables = [Variable(f"x{i}", np.array(a, dtype=np.float64), requires_grad=True) for i, a in enumerate(arrays)]
    out = build(*variables)
    Graph(out).forward()
    weights = np.random.default_rng(seed).normal(size=np.shape(out.value))
    loss = ops.Sum(ops.Mul(out, Variable("w", weights)))
    graph = Graph(loss)

    def f() -> float:
        return float(graph.forward()[0])

    f()
    graph.backward()
    for v in variables:
        expected = numerical_grad(f, v.value)
        assert v.grad is not None, f"{v.name} received no gradient"
        np.testing.assert_allclose(v.grad, expected, rtol=rtol, atol=atol, err_msg=v.name)


ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the real `magmadnn` entry point in-process; returns (exit code, stdout, stderr)."""
    import sys
    from magmadnn_cli import cli

    argv = sys.argv
    sys.argv = ["magmadnn", *map(str, args)]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_csv(path, header, rows) -> None:
    lines = [",".join(header)] + [",".join(map(str, r)) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def blobs_csv(path, n: int = 120, seed: int = 0, labels=("a", "b", "c")) -> None:
    """Three well-separated Gaussian blobs in 4 features, string labels."""
    r = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = i % len(labels)
        centre = np.eye(4)[k] * 4
        rows.append([*np.round(centre + r.normal(size=4), 4), labels[k]])
    write_csv(path, ["f1", "f2", "f3", "f4", "label"], rows)


TINY_CNN = """\
model:
  layers:
    - {type: conv2d, filters: 4, kernel_size: 3, padding: same, activation: relu}
    - {type: flatten}
    - {type: dense, units: 2, activation: softmax}
loss: cross_entropy
optimizer: {type: adam, learning_rate: 0.01}
training: {epochs: 1, batch_size: 4}
"""  # a small CNN for two classes of image files, one epoch (a config's model to training)


BLOBS_CONFIG = """\
name: blobs
seed: 1
device: cpu
data:
  train: blobs.csv
  target: label
  validation_split: 0.2
  normalize: standard
model:
  layers:
    - {type: dense, units: 16, activation: relu}
    - {type: dense, units: 3, activation: softmax}
loss: cross_entropy
optimizer: {type: adam, learning_rate: 0.01}
training:
  epochs: 15
  batch_size: 16
"""


def project(folder, text: str = BLOBS_CONFIG):
    """blobs.csv and a config `c.yaml` of `text` in `folder`; returns the config's path."""
    blobs_csv(folder / "blobs.csv")
    (folder / "c.yaml").write_text(text)
    return folder / "c.yaml"


def snapshot(folder) -> dict[str, bytes]:
    """Every file under `folder` by relative path, with its bytes (to prove nothing changed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def blobs(tmp_path):
    """A tiny real project: blobs.csv and a config beside it. Returns the config path."""
    blobs_csv(tmp_path / "blobs.csv")
    config = tmp_path / "blobs.yaml"
    config.write_text(BLOBS_CONFIG)
    return config


def find_mpiexec() -> str | None:
    """This environment's mpiexec (the one mpi4py's MPI needs), or None where there is none."""
    from magmadnn_cli.distributed.launcher import locate_mpi_launcher
    from magmadnn_cli.errors import MagmaError
    try:
        return locate_mpi_launcher()
    except MagmaError:
        return None


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process in /proc."""
    from pathlib import Path
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(stat.parent.name)] = (int(fields[1]), fields[0])
    return table


def job_processes(root: int) -> set[int]:
    """`root` and its descendants: mpiexec starts its proxy and every rank in a session of its own
    (setsid), so a process group or session does not hold a job's ranks; the parent links do."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in _process_table().items():
        children.setdefault(parent, []).append(pid)
    found, frontier = {root}, [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def still_running(pids: set[int]) -> set[int]:
    """Those of `pids` still running (zombies, which some containers never reap, do not count)."""
    table = _process_table()
    return {pid for pid in pids if pid in table and table[pid][1] not in ("Z", "X")}


def wait_until_gone(pids: set[int], seconds: float = 10) -> set[int]:
    """Wait until none of `pids` runs (at most `seconds`); returns those still running."""
    import time
    deadline = time.monotonic() + seconds
    while (left := still_running(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def assert_a_failing_rank_ends_the_job(folder, body: str, message: str) -> None:
    """Run `body` (a script whose rank 1 raises `message` while rank 0 waits in a collective) on 2
    ranks: the job must fail, print the message, and end within 30 s (no hung rank)."""
    import subprocess
    import sys
    import time
    script = folder / "fail.py"
    script.write_text(body)
    start = time.perf_counter()
    result = subprocess.run([str(find_mpiexec()), "-n", "2", sys.executable, str(script)], capture_output=True,
                            stdin=subprocess.DEVNULL, text=True, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr
    assert time.perf_counter() - start < 30


# -- training under real ranks (the distributed tests) --------------------------------------------
DIGITS = ROOT / "configs" / "digits_mlp.yaml"


def run_train(out, overrides: list[str], ranks: int = 0, config=DIGITS, quiet: bool = True,
              extra: tuple[str, ...] = (), launcher: tuple[str, ...] = ("-m", "magmadnn_cli"),
              extra_env: dict[str, str] | None = None):
    """`magmadnn train CONFIG --out OUT --set ...` on `ranks` mpiexec ranks (0: no mpiexec), one
    BLAS thread per rank; `launcher`: what python runs (a module or a script taking the CLI's args)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(extra_env or {}))
    sets = [arg for o in overrides for arg in ("--set", o)]
    prefix = [str(find_mpiexec()), "-n", str(ranks)] if ranks else []
    return subprocess.run([*prefix, sys.executable, *launcher, "train", str(config), "--out", str(out),
                           *(["-q"] if quiet else []), *sets, *extra],
                          capture_output=True, stdin=subprocess.DEVNULL, text=True, env=env, timeout=300)


def train_on(out, overrides: list[str], ranks: int = 0, **kwargs):
    result = run_train(out, overrides, ranks, **kwargs)
    assert result.returncode == 0, result.stderr
    return out


def saved_weights(run) -> dict[str, np.ndarray]:
    with np.load(run / "model.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files if k.startswith("weights/")}


def assert_same_weights(run, reference, tolerance: float) -> None:
    got, want = saved_weights(run), saved_weights(reference)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].shape == want[key].shape, key  # saved whole, not one rank's part
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=tolerance * max(1.0, np.abs(want[key]).max()),
                                   err_msg=key)


def assert_sigterm_to_the_launcher_stops_the_job(config, out, processes: int, overrides: list[str],
                                                 sig: int = 15, helpers: int = 2) -> None:
    """`magmadnn train CONFIG --processes N` (mpiexec as its child) gets SIGTERM once the first
    checkpoint is on disk, to the launcher alone (a scheduler, `kill`): the ranks write a checkpoint
    and stop, the launcher exits 143 saying how to resume, and no rank or mpiexec outlives it. `sig`:
    SIGTERM, or another stop signal (SIGUSR1, Slurm's warning before the time limit). `helpers`: the
    launcher's processes besides the ranks (mpiexec and hydra's proxy; Open MPI's mpirun alone: 1)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    sets = [arg for o in overrides for arg in ("--set", o)]
    launcher = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(out), "-q",
                                 "--processes", str(processes), *sets],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not list((out / "checkpoints").glob("step*.npz")) and time.monotonic() < deadline:
        time.sleep(0.05)
    job = job_processes(launcher.pid)  # the launcher, mpiexec, its proxy and the ranks
    assert len(job) >= 1 + helpers + processes, f"the job's processes were not found: {job}"
    launcher.send_signal(sig)  # to the launcher only, not its process group
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err and "--resume" in err
    assert not wait_until_gone(job), "a rank or mpiexec outlived the launcher"


def ctrl_c_in_epoch(monkeypatch, epoch: int) -> None:
    """Training gets a Ctrl-C as epoch `epoch` starts, as the signal handler delivers it (recorded,
    then KeyboardInterrupt): a stop at once, where on_signal is off or checkpoints are."""
    import signal

    from magmadnn_cli import signals
    from magmadnn_cli.training.trainer import Trainer
    real = Trainer._epoch

    def interrupted(self, *args):
        if self.position.epoch == epoch:
            signals.record(signal.SIGINT)
            raise KeyboardInterrupt
        return real(self, *args)
    monkeypatch.setattr(Trainer, "_epoch", interrupted)


STANDIN = ROOT / "tests" / "standin"


def _forget_cupy() -> None:
    import sys
    for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
        del sys.modules[name]


@pytest.fixture
def standin(monkeypatch):
    """The device stand-in (tests/standin/cupy) as `cupy`: `device: gpu` runs the real GPU branches on
    numpy memory; yields the module, whose LEDGER counts what crosses the host boundary."""
    from magmadnn_cli.core.graph import kernels

    monkeypatch.syspath_prepend(str(STANDIN))
    _forget_cupy()
    kernels.elementwise.cache_clear()
    import cupy
    assert getattr(cupy, "STANDIN", False), cupy.__file__
    cupy.LEDGER.strict = True
    try:
        yield cupy
    finally:
        _forget_cupy()
        kernels.elementwise.cache_clear()


def tiny_config(tmp_path, data: str, more: str = "") -> Path:
    """c.yaml in `tmp_path`: a one-layer classifier of `data` (target `label`), one epoch, no checkpoints;
    `more` adds data settings (", normalize: none")."""
    path = tmp_path / "c.yaml"
    path.write_text(
        f"name: t\nseed: 0\ndata: {{train: {data}, target: label, validation_split: 0.0{more}}}\nmodel:\n  layers:\n"
        "    - {type: dense, units: 2, activation: softmax}\nloss: cross_entropy\noptimizer: adam\n"
        "training: {epochs: 1, checkpoint: false}\n")
    return path
