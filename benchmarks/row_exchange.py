"""The dense weight-gradient work of ONE rank of N on a node, for the paper MLP (784 -> 3 x 528 -> 10)
at a global batch of 200, measured in one process with 1 BLAS thread (what each core of an N-core
node does; the contention of N busy cores is not in it: `scaling.py --profile` measures that on 2):

- own gradients, summed (`shared_memory` without the exchange): x^T dz over the rank's 200/N rows
  for every layer (whole weight-sized gradients), then the rank's 1/N share summed over N rows;
- rows exchanged (`row_exchange.py`): the rank's rows of x and dz copied to the node's buffer, then
  its 1/N share of x^T dz over all 200 rows.

    python benchmarks/row_exchange.py [--ranks 2 4 8 16]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import magmadnn_cli  # noqa: F401  then OpenBLAS's kernels (core/cpu_kernels.py), as a run picks them
import numpy as np

from magmadnn_cli.distributed.row_exchange import product_range

from conv import best

LAYERS = [(784, 528), (528, 528), (528, 528), (528, 10)]
BATCH = 200


def per_rank(ranks: int, rng: np.random.Generator) -> tuple[float, float]:
    """(own gradients + sum, rows exchanged) milliseconds for rank 0 of `ranks`."""
    rows = BATCH // ranks
    sizes = [i * o for i, o in LAYERS]
    offsets = np.cumsum([0, *sizes])
    total = int(offsets[-1])
    share = slice(0, total // ranks)
    xs = [rng.random((BATCH, i), dtype=np.float32) for i, _ in LAYERS]
    dzs = [rng.random((BATCH, o), dtype=np.float32) for _, o in LAYERS]
    grid = rng.random((ranks, total), dtype=np.float32)  # every rank's gradient row
    shared = [(np.empty_like(x), np.empty_like(dz)) for x, dz in zip(xs, dzs)]

    def own_and_sum() -> None:
        for k, (x, dz) in enumerate(zip(xs, dzs)):
            np.matmul(x[:rows].T, dz[:rows], out=grid[0, offsets[k]:offsets[k + 1]].reshape(LAYERS[k]))
        for other in range(1, ranks):
            grid[0, share] += grid[other, share]

    def exchanged() -> None:
        for (x, dz), (sx, sdz) in zip(zip(xs, dzs), shared):
            sx[:rows], sdz[:rows] = x[:rows], dz[:rows]
        for k, (sx, sdz) in enumerate(shared):
            lo, hi = max(int(offsets[k]), share.start), min(int(offsets[k + 1]), share.stop)
            if lo < hi:
                product_range(sx, sdz, grid[0, offsets[k]:offsets[k + 1]], lo - int(offsets[k]), hi - int(offsets[k]))

    return 1000 * best(own_and_sum, 30, 7), 1000 * best(exchanged, 30, 7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"paper MLP, global batch {BATCH}: one rank's dense weight-gradient work (ms, best of 7), 1 BLAS thread")
    print(f"{'ranks':>5} {'rows/rank':>9} {'own + sum':>10} {'exchanged':>10} {'ratio':>6}")
    for ranks in args.ranks:
        own, exchanged = per_rank(ranks, rng)
        print(f"{ranks:>5} {BATCH // ranks:>9} {own:>10.3f} {exchanged:>10.3f} {exchanged / own:>6.2f}")


if __name__ == "__main__":
    main()
