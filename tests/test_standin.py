"""The device stand-in (tests/standin/cupy) itself: it raises where cupy raises, counts what crosses the
host boundary by call site, and models stream capture faithfully (a replayed graph reruns the captured
operations on the same buffers, with host values frozen)."""

from __future__ import annotations

import numpy as np
import pytest

from magmadnn_cli.core import backend as B
from magmadnn_cli.core.graph import kernels


def test_strict_mode_raises_where_cupy_raises(standin):
    d = standin.arange(6, dtype=np.float32)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(d)
    with pytest.raises(TypeError, match="called on a device array"):
        np.exp(d)
    with pytest.raises(TypeError, match="host .numpy. array used as an operand"):
        d + np.ones(6, np.float32)
    assert not isinstance(d, np.ndarray)
    assert float((d * 2).sum()) == 30.0  # scalars and python numbers are fine operands


def test_reads_and_copies_are_counted_by_kind(standin):
    with standin.LEDGER.watch() as tally:
        d = standin.asarray(np.arange(4.0))         # a copy to the device
        total = d.sum()                             # a device 0-d array: no read
        value = float(total)                        # a read
        mask = d > 1
        picked = d[mask]                            # a boolean mask needs its count: a read
        host = picked.get()                         # a read
        rows = d[np.array([0, 2])]                  # a host index array is copied
    assert value == 6.0 and host.tolist() == [2.0, 3.0] and rows.shape == (2,)
    kinds = {kind: n for (_, kind), n in tally.reads.items()}
    assert kinds == {"float": 1, "boolean mask": 1, "get": 1}
    assert {kind for _, kind in tally.copies} == {"asarray", "host index"}
    assert tally.operations >= 4 and tally.new_bytes > 0


def test_backend_selects_the_standin_as_the_gpu(standin):
    backend = B.select("gpu")
    assert backend.device == "gpu" and backend.xp is standin


def test_capture_on_the_legacy_stream_is_refused(standin):
    with pytest.raises(TypeError, match="legacy default stream"):
        standin.cuda.Stream.null.begin_capture()


def test_work_on_the_legacy_stream_while_another_captures_is_refused(standin):
    x = standin.zeros(3)
    stream = standin.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    try:
        with pytest.raises(TypeError, match="cudaErrorStreamCaptureImplicit"):
            x += 1
    finally:
        stream.end_capture()


def test_a_read_or_a_copy_during_capture_is_refused(standin):
    x = standin.zeros(3)
    stream = standin.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pytest.raises(TypeError, match="device-to-host read"):
            float(x.sum())
        with pytest.raises(TypeError, match="host-to-device copy"):
            standin.asarray(np.ones(3))
        stream.end_capture()


def test_a_replayed_graph_reruns_the_step_on_its_buffers_with_host_values_frozen(standin):
    """p <- p - lr * (p - target): replaying the captured step moves p as eager steps do, but the host
    learning rate stays at its captured value even if the host changes it (a real graph's semantics)."""
    p, target, lr = standin.asarray(np.array([4.0, -2.0])), standin.asarray(np.array([1.0, 1.0])), 0.5
    stream = standin.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        p -= lr * (p - target)
        graph = stream.end_capture()
    np.testing.assert_array_equal(p.get(), [4.0, -2.0])  # capturing ran nothing
    lr = 100.0  # frozen in the graph
    for _ in range(3):
        graph.launch(stream)
    expected = np.array([4.0, -2.0])
    for _ in range(3):  # capturing ran nothing
        expected -= 0.5 * (expected - 1.0)
    np.testing.assert_allclose(p.get(), expected)


@pytest.mark.parametrize("name", sorted(kernels.KERNELS))
def test_every_custom_kernel_runs_its_reference_in_the_standin(standin, name):
    kernel = kernels.KERNELS[name]
    rng = np.random.default_rng(0)
    inputs = [p.split() for p in kernel.inputs.split(",")]
    host = [np.bool_(True) if kind == "bool" else rng.uniform(0.1, 1.0, 5).astype(np.float32) for kind, _ in inputs]
    outs = [rng.uniform(0.1, 1.0, 5).astype(np.float32) for _ in kernel.outputs.split(",")]
    expected = [o.copy() for o in outs]
    kernel.reference(*host, *expected)
    device_outs = [standin.asarray(o) for o in outs]
    kernels.elementwise(name)(*(standin.asarray(h) for h in host), *device_outs)
    for got, want in zip(device_outs, expected):
        np.testing.assert_array_equal(got.get(), want)
