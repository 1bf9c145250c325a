"""`magmadnn bench`: the MagmaDNN paper's experiment as a command. For each depth L it trains the
paper's MLP (784 -> L x 528 sigmoid -> 10 softmax, batch 100, SGD lr 0.05, weight decay 0.001) on
MNIST-shaped random data for whole epochs, and times beside it, in the same run: the GEMM-only floor
(the same matmuls and nothing else) and PyTorch eager on the same device when torch is installed.
The paper's measure is the time added per hidden layer (delta per layer)."""

from __future__ import annotations

import importlib.util
import time
from typing import Any, Callable

import numpy as np

from ..core import backend as B
from ..errors import MagmaError
from ..nn.layers import Dense
from ..nn.losses import CrossEntropy
from ..nn.network import Network
from ..nn.optimizers import SGD

BATCH, INPUTS, HIDDEN, CLASSES = 100, 784, 528, 10
LR, DECAY = 0.05, 0.001


def _data(samples: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    x = rng.random((samples, INPUTS), dtype=np.float32).astype(B.current().floatx)
    return B.to_device(x), B.to_device(rng.integers(0, CLASSES, samples))


def _epochs(step: Callable[[Any], None], samples: int, epochs: int) -> float:
    """Seconds for `epochs` passes of shuffled batches (the last one short), after one warm-up step."""
    order = np.random.default_rng(1)
    step(B.current().xp.arange(min(BATCH, samples)))
    B.synchronize()
    start = time.perf_counter()
    for _ in range(epochs):
        perm = B.to_device(order.permutation(samples))
        for i in range(0, samples, BATCH):
            step(perm[i:i + BATCH])
    B.synchronize()
    return time.perf_counter() - start


def ours(layers: int, samples: int, epochs: int) -> float:
    hidden = [Dense.of(units=HIDDEN, activation="sigmoid") for _ in range(layers)]
    net = Network(hidden + [Dense.of(units=CLASSES, activation="softmax")],
                  (INPUTS,), CrossEntropy(), seed=0)
    opt = SGD.of(learning_rate=LR, weight_decay=DECAY)
    x, y = _data(samples)

    def step(rows: Any) -> None:
        net.forward_backward(x[rows], y[rows])
        opt.step(net.flat_params, net.flat_grads)
    return _epochs(step, samples, epochs)


def gemm_floor(layers: int, samples: int, epochs: int) -> float:
    """Per step: one GEMM per layer forward; dW = h^T dz per layer and dh = dz W^T (but the first)."""
    xp = B.current().xp
    widths = [INPUTS] + [HIDDEN] * layers + [CLASSES]
    rng = np.random.default_rng(2)
    floatx = B.current().floatx
    ws = [B.to_device(rng.random((a, b), dtype=np.float32).astype(floatx)) for a, b in zip(widths, widths[1:])]
    hs = [B.to_device(rng.random((BATCH, w), dtype=np.float32).astype(B.current().floatx)) for w in widths]
    dws = [xp.empty_like(w) for w in ws]

    def step(rows: Any) -> None:
        n = len(rows)
        for i, w in enumerate(ws):
            xp.matmul(hs[i][:n], w, out=hs[i + 1][:n])
        dz = hs[-1][:n]
        for i in reversed(range(len(ws))):
            xp.matmul(hs[i][:n].T, dz, out=dws[i])
            if i:
                dz = dz @ ws[i].T
    return _epochs(step, samples, epochs)


def torch_time(layers: int, samples: int, epochs: int) -> float | None:
    """PyTorch eager, the same network, data and optimizer on the same device; None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # optional
    device = "cuda" if B.current().device == "gpu" and torch.cuda.is_available() else "cpu"
    dtype = torch.float64 if B.current().floatx == np.float64 else torch.float32
    torch.manual_seed(0)
    mods: list[Any] = []
    for a, b in zip([INPUTS] + [HIDDEN] * layers, [HIDDEN] * layers):
        mods += [torch.nn.Linear(a, b), torch.nn.Sigmoid()]
    net = torch.nn.Sequential(*mods, torch.nn.Linear(HIDDEN if layers else INPUTS, CLASSES)).to(device, dtype)
    opt = torch.optim.SGD(net.parameters(), lr=LR, weight_decay=DECAY)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.random((samples, INPUTS), dtype=np.float32), device=device, dtype=dtype)
    y = torch.as_tensor(rng.integers(0, CLASSES, samples), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    order = np.random.default_rng(1)

    def step(rows: Any) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x[rows]), y[rows]).backward()
        opt.step()

    step(torch.arange(min(BATCH, samples), device=device))
    sync()
    start = time.perf_counter()
    for _ in range(epochs):
        perm = torch.as_tensor(order.permutation(samples), device=device)
        for i in range(0, samples, BATCH):
            step(perm[i:i + BATCH])
    sync()
    return time.perf_counter() - start


def depths_of(layers: str) -> list[int]:
    """`--layers` ("1,2,3,4") as depths, each from 0 to 64."""
    try:
        depths = [int(v) for v in layers.split(",") if v.strip()]
    except ValueError:
        raise MagmaError(f"--layers: expected comma-separated whole numbers like 1,2,3,4; received {layers!r}") from None
    if not depths or min(depths) < 0 or max(depths) > 64:
        raise MagmaError(f"--layers: expected depths from 0 to 64; received {layers!r}")
    return depths


def bench(layers: list[int], samples: int, epochs: int, device: str = "auto",
          report: Callable[[dict[str, Any]], None] | None = None, precision: str = "float32") -> list[dict[str, Any]]:
    """One record per depth: seconds for ours, the GEMM floor and PyTorch (None without it), and the
    time our run adds per hidden layer over the previous depth measured. Under a mixed `precision` ours
    takes half-type operands (emulated on the CPU: slower there), the floor and PyTorch float32's."""
    with B.using(B.select(device, precision)):
        records: list[dict[str, Any]] = []
        for depth in layers:
            record = {"layers": depth, "device": B.current().device, "precision": precision, "samples": samples,
                      "epochs": epochs, "batch": BATCH,
                      "seconds": ours(depth, samples, epochs), "floor_seconds": gemm_floor(depth, samples, epochs),
                      "torch_seconds": torch_time(depth, samples, epochs)}
            previous = records[-1] if records else None
            record["delta_per_layer_s"] = ((record["seconds"] - previous["seconds"]) / (depth - previous["layers"])
                                           if previous and depth != previous["layers"] else None)
            records.append(record)
            if report:
                report(record)
        return records
