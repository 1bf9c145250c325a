"""Dense weight gradients from every node-local rank's rows (part of the `shared_memory` strategy).

A dense layer's weight gradient is x^T dz summed over the batch's rows. Plain data parallelism has
every rank compute it over its own rows (a GEMM whose inner dimension is the rank's rows, writing a
whole weight-sized gradient) and then sums the ranks' gradients. Here the ranks of a node instead
copy their rows of x and dz into node-shared memory, and each computes only ITS share of the
gradient (the `share` of the flat buffer it reduces and updates anyway) from all the node's rows:

- no weight-sized gradient is written per rank, and that part of the share needs no summing;
- the GEMM's inner dimension is the node's rows, as in one process, so it runs at one process's
  efficiency (a GEMM over few rows pays a fixed cost per output: docs/distributed.md).

It pays while the rows are no larger than the weights: a layer is exchanged in a step when the
node's rows times (inputs + outputs) is at most `RATIO` times inputs x outputs; otherwise each rank
computes its own gradient as before. Under gradient accumulation (several backward passes a step)
nothing is deferred. The rows are packed in rank order at 64-byte aligned places, so a step's
result depends only on that step's rows per rank: resume stays bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.graph.nn import Dense
from .comm import shared_memory_fits

RATIO = 1.0  # exchange a layer's rows when they hold at most this many times its weights' floats
ALIGN = 64  # bytes: where each layer's rows start in the shared buffer


@dataclass(eq=False)
class _Layer:
    """A dense op whose weight gradient may be exchanged: where its kernel lies in the flat buffer."""
    op: Any
    offset: int
    inputs: int
    outputs: int
    rows: tuple[np.ndarray, np.ndarray] | None = None  # this step's (x, dz), until the reduction
    exchanged_steps: int = 0

    @property
    def size(self) -> int:
        return self.inputs * self.outputs


@dataclass
class _Step:
    """What the node's ranks agreed for one step: its rows, this rank's first row, and the exchanged
    layers' rows of x and dz in the shared buffer (by layer id)."""
    total: int = 0
    start: int = 0
    regions: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class RowExchange:
    """The node's dense rows in shared memory, and this rank's share of their weight gradients."""

    def __init__(self, comm: Any, layers: list[_Layer], dtype: np.dtype) -> None:
        self.comm, self.layers, self.dtype = comm, layers, dtype
        self.defer(True)
        self._by_op = {id(layer.op): layer for layer in layers}
        self.counts = comm.allocate_shared(comm.local_size, np.dtype(np.int64))
        self.capacity, self.starts, self.memory, self.window = 0, [], np.empty(0, dtype), None
        self.step = _Step()

    @classmethod
    def of(cls, comm: Any, network: Any, dtype: np.dtype) -> RowExchange | None:
        """The exchange for a network's dense layers (None without any: nothing to agree on)."""
        layers = [_Layer(op, network.flat_offset(op.inputs[1]), *op.inputs[1].value.shape)
                  for op in network.train_graph.ops if isinstance(op, Dense)]
        return cls(comm, layers, dtype) if layers else None

    def defer(self, on: bool) -> None:
        """Whether the dense layers hand their rows here (steps of one backward pass) or compute their
        weight gradients as usual (gradient accumulation: rows of every pass would stay in memory)."""
        for layer in self.layers:
            layer.op.deferral = self if on else None

    def take(self, op: Any, x: np.ndarray, dz: np.ndarray) -> None:
        """A backward pass's rows, kept until the reduction."""
        layer = self._by_op[id(op)]
        if layer.rows is not None:
            raise RuntimeError("two backward passes in one step: tell start_step(2) (gradient accumulation)")
        layer.rows = (x, dz)

    def publish(self, grads: np.ndarray) -> None:
        """Before the node's ranks read one another's rows: agree on the step's rows per rank, copy
        this rank's rows of the exchanged layers into their packed place (rank order), and compute
        the other layers' gradients here, into this rank's `grads`."""
        active = [layer for layer in self.layers if layer.rows is not None]  # the same on every rank
        self.step = _Step()
        if not active:
            return
        self.step.total, self.step.start = self._agree_rows(len(active[0].rows[0]))
        exchanged = [layer for layer in active if self._pays(layer)]
        if exchanged and self.step.total > self.capacity and not self._grow(self.step.total):
            exchanged = []
        for layer in active:
            if layer in exchanged:
                self._pack(layer)
            else:
                x, dz = layer.rows
                np.matmul(x.T, dz, out=grads[layer.offset:layer.offset + layer.size].reshape(x.shape[1], -1))
            layer.rows = None

    def compute(self, grads: np.ndarray, share: slice) -> list[tuple[int, int]]:
        """After every rank published: this rank's share of the exchanged layers' weight gradients
        from all the node's rows, into `grads`. Returns the flat ranges of the share it computed."""
        done = []
        for layer in self.layers:
            if id(layer) not in self.step.regions:
                continue
            xs, dzs = self.step.regions[id(layer)]
            lo, hi = max(layer.offset, share.start), min(layer.offset + layer.size, share.stop)
            if lo < hi:
                product_range(xs[:self.step.total], dzs[:self.step.total],
                              grads[layer.offset:layer.offset + layer.size], lo - layer.offset, hi - layer.offset)
                done.append((lo, hi))
        return sorted(done)

    def summary(self) -> dict[str, int]:
        """In how many of this run's steps each dense layer's weight gradient came from the node's
        rows (a resumed run counts its own steps)."""
        return {layer.op.name: layer.exchanged_steps for layer in self.layers}

    def _agree_rows(self, mine: int) -> tuple[int, int]:
        """(the node's rows this step, this rank's first row among them): every rank writes its count."""
        self.counts[self.comm.local_rank] = mine
        self.comm.local.Barrier()  # every rank's count is written
        counts = self.counts.copy()
        return int(counts.sum()), int(counts[:self.comm.local_rank].sum())

    def _pays(self, layer: _Layer) -> bool:
        return self.step.total * (layer.inputs + layer.outputs) <= RATIO * layer.size

    def _pack(self, layer: _Layer) -> None:
        """This rank's rows of x and dz into their place among the node's rows."""
        x, dz = layer.rows
        xs, dzs = self.step.regions[id(layer)] = self._regions(layer)
        xs[self.step.start:self.step.start + len(x)] = x
        dzs[self.step.start:self.step.start + len(x)] = dz
        layer.exchanged_steps += 1

    def _layout(self, capacity: int) -> tuple[list[int], int]:
        """Where each layer's rows of x, then of dz, start (aligned), and the floats of all."""
        step, starts, at = max(1, ALIGN // self.dtype.itemsize), [], 0
        for layer in self.layers:
            for width in (layer.inputs, layer.outputs):
                starts.append(at)
                at += -(-capacity * width // step) * step
        return starts, at

    def _regions(self, layer: _Layer) -> tuple[np.ndarray, np.ndarray]:
        """A layer's rows of x and of dz in the shared buffer."""
        cap, i = self.capacity, 2 * self.layers.index(layer)
        x_at, dz_at = self.starts[i], self.starts[i + 1]
        return (self.memory[x_at:x_at + cap * layer.inputs].reshape(cap, layer.inputs),
                self.memory[dz_at:dz_at + cap * layer.outputs].reshape(cap, layer.outputs))

    def _grow(self, rows: int) -> bool:
        """Room for `rows` rows of every dense layer (collective over the node: its ranks saw the
        same counts); False, using none, where /dev/shm lacks the room."""
        starts, count = self._layout(rows)
        if not self.comm.node_agrees(shared_memory_fits(count * self.dtype.itemsize)):
            return False
        if self.window is not None:
            self.comm.free_shared(self.window)
        self.capacity, self.starts = rows, starts
        self.memory, self.window = self.comm.allocate_shared_window(count, self.dtype)
        return True


def product_range(x: np.ndarray, dz: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
    """out[lo:hi] = (x^T dz).ravel()[lo:hi]: whole rows by one GEMM, a partial first and last row
    by a vector-matrix product each."""
    width = dz.shape[1]
    first, c0 = divmod(lo, width)
    last, c1 = divmod(hi, width)
    if first == last:
        out[lo:hi] = x[:, first] @ dz[:, c0:c1]
        return
    if c0:
        out[lo:(first + 1) * width] = x[:, first] @ dz[:, c0:]
        first += 1
    if last > first:
        np.matmul(x[:, first:last].T, dz, out=out[first * width:last * width].reshape(last - first, width))
    if c1:
        out[last * width:hi] = x[:, last] @ dz[:, :c1]
