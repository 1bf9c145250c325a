"""The cupy path: skipped cleanly without a usable GPU; where one exists, the same network computes
the same loss, gradients and training trajectory as numpy."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.core import backend as B
from magmadnn_cli.errors import DeviceError
from magmadnn_cli.nn.layers import Dense, Dropout
from magmadnn_cli.nn.losses import CrossEntropy
from magmadnn_cli.nn.network import Network
from magmadnn_cli.nn.optimizers import LAMB, LARS, SGD, Adam

GPU, WHY = B.probe_gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason=f"no usable GPU: {WHY}")


def test_auto_falls_back_quietly_and_explicit_gpu_is_a_clear_error():
    if GPU:
        pytest.skip("this machine has a GPU")
    chosen = B.select("auto")
    assert chosen.device == "cpu" and chosen.xp is np and B.current() == B.CPU
    with pytest.raises(DeviceError, match="device: gpu was requested but no usable GPU was found"):
        B.select("gpu")


def _run(device: str, precision: str, steps: int = 5, hidden: str = "tanh", make_opt=lambda: Adam.of(learning_rate=0.01)):
    with B.using(B.select(device, precision)):
        return _steps(precision, steps, hidden, make_opt)


def _steps(precision: str, steps: int, hidden: str, make_opt):
    rng = np.random.default_rng(0)
    x = B.to_device(rng.normal(size=(64, 20)).astype(precision))
    y = B.to_device(rng.integers(0, 4, 64))
    # dropout masks are counter-based: the same on the GPU as on the CPU
    net = Network([Dense.of(units=32, activation=hidden), Dropout.of(rate=0.3), Dense.of(units=32, activation="relu"), Dense.of(units=4, activation="softmax")], (20,), CrossEntropy(), seed=3)
    opt = make_opt()
    opt.set_segments(net.parameter_shapes)
    losses = []
    for _ in range(steps):
        losses.append(float(net.forward_backward(x, y)))
        grads = B.to_host(net.flat_grads).copy()
        opt.step(net.flat_params, net.flat_grads)
    return np.array(losses), grads, B.to_host(net.flat_params).copy()


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("float64", 1e-10), ("float32", 2e-4)])
@pytest.mark.parametrize("hidden,make_opt", [
    ("tanh", lambda: Adam.of(learning_rate=0.01)),
    ("sigmoid", lambda: SGD.of(learning_rate=0.5, weight_decay=0.01)),  # the fused GPU kernels
    ("sigmoid", lambda: SGD.of(learning_rate=0.1, momentum=0.9, nesterov=True)),
    ("tanh", lambda: LARS.of(learning_rate=2.0, weight_decay=0.01)),  # per-tensor norms on the device
    ("tanh", lambda: LAMB.of(learning_rate=0.01, weight_decay=0.01)),
])
def test_gpu_matches_cpu(precision, tol, hidden, make_opt):
    cpu = _run("cpu", precision, hidden=hidden, make_opt=make_opt)
    gpu = _run("gpu", precision, hidden=hidden, make_opt=make_opt)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol)


@needs_gpu
@pytest.mark.gpu
def test_gpu_training_command_end_to_end(tmp_path, capsys, blobs):
    from conftest import run_cli
    code, _, err = run_cli(capsys, "train", blobs, "--out", tmp_path / "r", "-q", "--set", "device=gpu")
    assert code == 0, err
    import json
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["device"] == "gpu" and metrics["validation"]["accuracy"] >= 0.95
    code, out, _ = run_cli(capsys, "predict", tmp_path / "r" / "model.npz", tmp_path / "blobs.csv", "--device", "gpu")
    assert code == 0 and len(out.splitlines()) == 121


def _cnn_run(device: str, precision: str = "float64"):
    with B.using(B.select(device, precision)):
        return _cnn_steps(precision)


def _cnn_steps(precision: str):
    from magmadnn_cli.nn.layers import BatchNorm, Conv2D, GlobalAvgPool, Pool2D, Residual
    rng = np.random.default_rng(0)
    x = B.to_device(rng.normal(size=(6, 2, 8, 8)).astype(precision))
    y = B.to_device(rng.integers(0, 3, 6))
    layers = [Conv2D.of(filters=4, kernel_size=3, padding="same", activation="relu"), BatchNorm.of(), Pool2D.of(mode="max", pool_size=2),
              Residual.of(layers=[{"type": "conv2d", "filters": 4, "padding": "same", "activation": "tanh"},
                                  {"type": "conv2d", "filters": 4, "padding": "same"}], activation="relu"),
              Pool2D.of(mode="avg", pool_size=2, stride=1), GlobalAvgPool.of(), Dense.of(units=3, activation="softmax")]
    net = Network(layers, (2, 8, 8), CrossEntropy(), seed=2)
    opt = SGD.of(learning_rate=0.1, momentum=0.9)
    for _ in range(3):
        loss = float(net.forward_backward(x, y))
        opt.step(net.flat_params, net.flat_grads)
    return loss, B.to_host(net.flat_params).copy(), B.to_host(net.predict(x))


@needs_gpu
@pytest.mark.gpu
def test_gpu_cnn_matches_cpu():
    cpu, gpu = _cnn_run("cpu"), _cnn_run("gpu")
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-10)


class _FakeNccl:
    """Records the calls cupy.cuda.nccl would receive (the NCCL path cannot run without GPUs)."""
    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 7, 8, 0
    calls: list = []

    @staticmethod
    def get_unique_id():
        return (1, 2, 3)

    class NcclCommunicator:
        def __init__(self, size, unique_id, rank):
            _FakeNccl.calls.append(("init", size, unique_id, rank))

        def allReduce(self, send, recv, count, dtype, op, stream):
            _FakeNccl.calls.append(("allReduce", send == recv, count, dtype, op, stream))

        def bcast(self, ptr, count, dtype, root, stream):
            _FakeNccl.calls.append(("bcast", count, dtype, root, stream))


class _FakeDeviceArray:
    def __init__(self, host):
        self.host, self.dtype, self.size, self.flags = host, host.dtype, host.size, host.flags
        self.data = type("Pointer", (), {"ptr": host.ctypes.data})()


def test_nccl_reducer_passes_the_buffer_in_place_with_its_type():
    from magmadnn_cli.distributed.nccl import NcclReducer
    _FakeNccl.calls = []
    seen = []
    reducer = NcclReducer(_FakeNccl, rank=1, size=4, bcast=lambda uid: seen.append(uid) or (1, 2, 3), stream=99)
    assert seen == [None]  # rank 1 receives rank 0's id over MPI
    reducer.allreduce_sum(_FakeDeviceArray(np.zeros(10, np.float32)))
    reducer.bcast(_FakeDeviceArray(np.zeros(6, np.float64)), root=0)
    assert _FakeNccl.calls == [("init", 4, (1, 2, 3), 1), ("allReduce", True, 10, 7, 0, 99), ("bcast", 6, 8, 0, 99)]
    with pytest.raises(TypeError, match="int32"):
        reducer.allreduce_sum(_FakeDeviceArray(np.zeros(3, np.int32)))


@needs_gpu
def test_nccl_is_importable_where_cupy_is():
    from magmadnn_cli.distributed.nccl import load_nccl
    nccl = load_nccl()
    assert nccl is None or hasattr(nccl, "NcclCommunicator")


@needs_gpu
@pytest.mark.gpu
def test_counter_based_masks_are_the_same_on_the_gpu():
    from magmadnn_cli.core.counter_random import keep_mask
    gpu_backend = B.select("gpu", "float32")
    positions = np.arange(100, 164)
    cpu = keep_mask(99, positions, (64, 3, 5, 5), 0.4, np.float32, np)
    gpu = keep_mask(99, gpu_backend.xp.asarray(positions), (64, 3, 5, 5), 0.4, np.float32, gpu_backend.xp)
    np.testing.assert_array_equal(B.to_host(gpu), cpu)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(__import__("magmadnn_cli.core.graph.kernels", fromlist=["KERNELS"]).KERNELS))
def test_every_custom_kernel_computes_its_numpy_reference(name):
    """The CUDA body against the numpy reference declared beside it (what the suite's stand-in runs),
    with scalars passed as production passes them (0-d device arrays and numpy scalars) and both ways of
    a bool flag (an update skipped by `ok` false leaves its outputs as they were)."""
    from magmadnn_cli.core.graph import kernels
    kernel = kernels.KERNELS[name]
    kinds = [p.split()[0] for p in kernel.inputs.split(",")]
    for flag in (True, False):
        rng = np.random.default_rng(0)
        host = [np.bool_(flag) if kind == "bool" else np.float32(rng.uniform(0.1, 1.0)) if i else
                rng.uniform(0.1, 1.0, 1000).astype(np.float32) for i, kind in enumerate(kinds)]
        outs = [rng.uniform(0.1, 1.0, 1000).astype(np.float32) for _ in kernel.outputs.split(",")]
        expected = [o.copy() for o in outs]
        kernel.reference(*host, *expected)
        with B.using(B.select("gpu", "float32")):
            xp = B.current().xp
            device_outs = [xp.asarray(o) for o in outs]
            args = [xp.asarray(h) if i in (0, 1) and not isinstance(h, np.bool_) else h for i, h in enumerate(host)]
            kernels.elementwise(name)(*args, *device_outs)  # the first scalar as a 0-d device array
            for got, want in zip(device_outs, expected):
                np.testing.assert_allclose(B.to_host(got), want, rtol=2e-6, atol=1e-7)
