"""The convolution op (one of the algorithms in `convolution`, chosen per layer) and pooling
(running max/sum) on NCHW arrays. Every loop runs over kernel offsets only, never samples or pixels."""

from __future__ import annotations

from typing import Sequence

from .. import backend as B
from .convolution import ALGORITHMS, CHOICES, Geometry, Pair, candidates, fastest, output_size, rule, time_algorithms
from .node import IN_PLACE, Array, Node, Op


class Conv2D(Op):
    """y[n, f] = sum_c,i,j w[f, c, i, j] x[n, c, s*y + d*i - p, s*x + d*j - p] + b[f].

    `algorithm` names the registry entry that runs it, or `auto` (the fixed `rule`); an algorithm
    that cannot run this geometry falls back to gemm (see `effective_algorithm`). `tune(x)` times
    every candidate and keeps the fastest (dMath's autotuning, for `fastest`)."""

    def __init__(self, x: Node, w: Node, b: Node | None, stride: Pair, pad: Pair, dilation: Pair,
                 algorithm: str = "gemm") -> None:
        super().__init__(*((x, w) if b is None else (x, w, b)), name="conv2d")
        self.stride, self.pad, self.dilation = stride, pad, dilation
        self.algorithm = algorithm
        self.runner = None  # the algorithm instance that ran the last forward pass

    def _geometry(self, w: Array) -> Geometry:
        return Geometry(tuple(w.shape[2:]), self.stride, self.pad, self.dilation)

    def effective_algorithm(self, w: Array) -> str:
        """The algorithm that runs: the chosen one where it supports the layer, else gemm; for auto
        (and fastest before it is timed) the fixed rule's."""
        geometry = self._geometry(w)
        if self.algorithm in ("auto", "fastest"):
            return rule(geometry, int(w.shape[1]), int(w.shape[0]))
        return self.algorithm if self.algorithm in candidates(geometry) else "gemm"

    def tune(self, x: Array) -> dict[str, float]:
        """Time every algorithm that supports this layer on `x` and keep the fastest (`fastest`'s
        rule); returns the times."""
        w, b = self.inputs[1].value, (self.inputs[2].value if len(self.inputs) == 3 else None)
        times = time_algorithms(self._geometry(w), x, w, b, self.inputs[0].requires_grad)
        self.algorithm = fastest(times)
        return times

    def forward(self, x: Array, w: Array, b: Array | None = None) -> Array:
        name = self.effective_algorithm(w)
        if self.runner is None or self.runner.name != name:
            self.runner = ALGORITHMS[name](self._geometry(w))
        return self.runner.forward(x, w, b)

    def backward(self, g: Array) -> Sequence[Array | None]:
        x, w = self.inputs[0], self.inputs[1]
        dx, dw, db = self.runner.backward(g, w.value, x.requires_grad)
        return [dx, dw, db] if len(self.inputs) == 3 else [dx, dw]


class Pool2D(Op):
    """Max or average over windows; max routes the gradient to the (first) largest input, average
    spreads it evenly (padding counts as -inf for max and as 0 for average). Both walk the kh x kw
    window offsets as strided views of the input with a running max or sum, so no
    (N, C, kh, kw, Ho, Wo) window array is built; the backward pass finds each window's first max
    by comparing again (boolean masks multiply fast where numpy's masked copies are slow: docs/performance.md)."""

    def __init__(self, x: Node, mode: str, kernel: Pair, stride: Pair, pad: Pair) -> None:
        super().__init__(x, name=f"{mode}_pool2d")
        self.mode, self.kernel, self.stride, self.pad = mode, kernel, stride, pad

    def _offsets(self, x: Array) -> list[tuple[int, tuple[slice, ...]]]:
        """(offset number, the strided view index of that window offset), row-major."""
        (kh, kw), (sh, sw) = self.kernel, self.stride
        _, _, h, w = x.shape
        ho, wo = output_size(h, kh, sh, 0), output_size(w, kw, sw, 0)
        return [(i * kw + j, (slice(None), slice(None), slice(i, i + sh * (ho - 1) + 1, sh),
                              slice(j, j + sw * (wo - 1) + 1, sw))) for i in range(kh) for j in range(kw)]

    def forward(self, x: Array) -> Array:
        xp = B.array_module(x)
        ph, pw = self.pad
        if ph or pw:
            x = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)),
                       constant_values=-xp.inf if self.mode == "max" else 0.0)
        self.padded = x
        offsets = self._offsets(x)
        out = x[offsets[0][1]].copy()
        for _, view in offsets[1:]:
            if self.mode == "max":
                xp.maximum(out, x[view], out=out)
            else:
                out += x[view]
        if self.mode != "max":
            out *= 1.0 / len(offsets)
        return out

    def backward(self, g: Array) -> Sequence[Array]:
        xp = B.array_module(g)
        n, c, h, w = self.inputs[0].value.shape
        (ph, pw), x = self.pad, self.padded
        (kh, kw), (ho, wo) = self.kernel, g.shape[2:]
        tiles = self.stride == self.kernel and ho * kh == x.shape[2] and wo * kw == x.shape[3]
        dx = (xp.empty_like if tiles else xp.zeros_like)(x, dtype=g.dtype)  # tiles: every input in one window
        if self.mode == "max":
            self._route_max(x, g, dx, tiles)
        else:
            share = g * (1.0 / (kh * kw))
            for _, view in self._offsets(x):
                if tiles:
                    dx[view] = share
                else:
                    dx[view] += share
        return (dx[:, :, ph:ph + h, pw:pw + w],)

    def _route_max(self, x: Array, g: Array, dx: Array, tiles: bool) -> None:
        """Each window's gradient to the first offset holding its max (ties: one only)."""
        xp, offsets = B.array_module(g), self._offsets(x)
        taken = None  # where an earlier offset already held the max
        for k, view in offsets:
            hit = xp.equal(x[view], self.value)
            if taken is None:
                taken = hit
            else:
                xp.greater(hit, taken, out=hit)  # the max here, and at no earlier offset
                if k < len(offsets) - 1:
                    taken |= hit
            if tiles:
                xp.multiply(g, hit, out=dx[view])
            else:
                dx[view] += g * hit


__all__ = ["CHOICES", "Conv2D", "Geometry", "IN_PLACE", "Pool2D", "output_size"]
