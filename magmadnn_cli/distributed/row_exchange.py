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
node's rows times (inputs + outputs) is at most `RATIO` times inputs x outputs; otherwise (and for
layers not eligible) each rank computes its own gradient as before. The rows are packed in rank
order, so a step's result depends only on that step's rows per rank: resume stays bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.graph.nn import Dense
from .comm import shared_memory_fits

RATIO = 1.0  # exchange a layer's rows when they hold at most this many times its weights' floats


@dataclass
class _Layer:
    """A dense op whose weight gradient may be exchanged: where its kernel lies in the flat buffer."""
    op: Any
    offset: int
    inputs: int
    outputs: int
    rows: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # this step's (x, dz)
    exchanged_steps: int = 0

    @property
    def size(self) -> int:
        return self.inputs * self.outputs


class RowExchange:
    """The node's dense rows in shared memory, and this rank's share of their weight gradients."""

    def __init__(self, comm: Any, network: Any, dtype: np.dtype) -> None:
        self.comm, self.dtype = comm, dtype
        self.layers = [_Layer(op, network.flat_offset(op.inputs[1]), *op.inputs[1].value.shape)
                       for op in network.train_graph.ops if isinstance(op, Dense)]
        for layer in self.layers:
            layer.op.deferral = self
        self._by_op = {id(layer.op): layer for layer in self.layers}
        self.counts = comm.allocate_shared(comm.local_size, np.dtype(np.int64))
        self.capacity, self.memory, self.window = 0, np.empty(0, dtype), None
        self.total, self.regions = 0, {}  # this step's rows on the node; exchanged layers' (x, dz) rows

    def take(self, op: Any, x: np.ndarray, dz: np.ndarray) -> bool:
        """Keep a backward pass's rows (several per step under gradient accumulation)."""
        self._by_op[id(op)].rows.append((x, dz))
        return True

    def publish(self, grads: np.ndarray) -> None:
        """Before the node's ranks read one another's rows: agree on the step's rows per rank, write
        this rank's rows of the exchanged layers into their packed place (rank order), and compute
        the other layers' gradients here, into this rank's `grads`."""
        active = [layer for layer in self.layers if layer.rows]  # the same on every rank: one graph
        self.counts[self.comm.local_rank] = sum(len(x) for x, _ in active[0].rows) if active else 0
        self.comm.local.Barrier()  # every rank's count is written
        counts = self.counts.copy()
        self.total, at = int(counts.sum()), int(counts[:self.comm.local_rank].sum())
        exchanged = [layer for layer in active if self.total * (layer.inputs + layer.outputs) <= RATIO * layer.size]
        if exchanged and self.total > self.capacity and not self._grow(self.total):
            exchanged = []
        self.regions, offset = {}, 0
        for layer in exchanged:
            xs, dzs = self.regions[id(layer)] = self._regions(layer, offset)
            offset += self.capacity * (layer.inputs + layer.outputs)
            layer.exchanged_steps += 1
            row = at
            for x, dz in layer.rows:
                xs[row:row + len(x)], dzs[row:row + len(x)] = x, dz
                row += len(x)
        for layer in active:
            if id(layer) not in self.regions:
                self._own_gradient(layer, grads)
            layer.rows.clear()

    def compute(self, grads: np.ndarray, share: slice) -> list[tuple[int, int]]:
        """After every rank published: this rank's share of the exchanged layers' weight gradients
        from all the node's rows, into `grads`. Returns the flat ranges of the share it computed."""
        done = []
        for layer in self.layers:
            if id(layer) not in self.regions:
                continue
            xs, dzs = self.regions[id(layer)]
            lo, hi = max(layer.offset, share.start), min(layer.offset + layer.size, share.stop)
            if lo < hi:
                _product_range(xs[:self.total], dzs[:self.total], grads[layer.offset:layer.offset + layer.size],
                               lo - layer.offset, hi - layer.offset)
                done.append((lo, hi))
        return sorted(done)

    def _regions(self, layer: _Layer, offset: int) -> tuple[np.ndarray, np.ndarray]:
        """A layer's rows of x and of dz in the shared memory, from `offset`."""
        cap, middle = self.capacity, offset + self.capacity * layer.inputs
        return (self.memory[offset:middle].reshape(cap, layer.inputs),
                self.memory[middle:middle + cap * layer.outputs].reshape(cap, layer.outputs))

    def _grow(self, rows: int) -> bool:
        """Room for `rows` rows of every eligible layer (collective: every rank saw the same counts)."""
        count = rows * sum(layer.inputs + layer.outputs for layer in self.layers)
        if not self.comm.all_agree(shared_memory_fits(count * self.dtype.itemsize)):
            return False
        if self.window is not None:
            self.comm.free_shared(self.window)
        self.capacity = rows
        self.memory, self.window = self.comm.allocate_shared_window(count, self.dtype)
        return True

    def summary(self) -> dict[str, int]:
        """In how many steps each dense layer's weight gradient came from the node's rows."""
        return {layer.op.name: layer.exchanged_steps for layer in self.layers}

    @staticmethod
    def _own_gradient(layer: _Layer, grads: np.ndarray) -> None:
        """This rank's own x^T dz (what the backward pass would have written)."""
        out = grads[layer.offset:layer.offset + layer.size].reshape(layer.inputs, layer.outputs)
        if not layer.rows:
            out.fill(0)
        for i, (x, dz) in enumerate(layer.rows):
            if i == 0:
                np.matmul(x.T, dz, out=out)
            else:
                out += x.T @ dz


def _product_range(x: np.ndarray, dz: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
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
