"""The magmadnn CLI with one artificially slow rank: a straggler (a busy node, a slower GPU, thermal
throttling), for the asynchronous-SGD benchmark and tests.

    MAGMADNN_SLOW_RANK=2:0.02 mpiexec -n 3 python benchmarks/straggler.py train CONFIG [options]

`RANK:SECONDS`: that rank sleeps SECONDS after every forward + backward pass (its gradient comes
later; a sleep leaves the CPU to the other ranks, as a rank on a machine of its own would).
`RANK:xK`: that rank is K times slower: it sleeps K - 1 times each pass's own duration.
`RANK:fail`: that rank raises on its first pass (a failing rank, for the no-hang tests).
Unset, or another rank: the CLI as it is.
"""

from __future__ import annotations

import os
import time

from magmadnn_cli.distributed.comm import launched_rank
from magmadnn_cli.nn.network import Network


def slow_down(rank: int, delay: str) -> None:
    """Make `rank`'s forward + backward pass `delay` seconds slower ('0.02'), K times slower ('xK'),
    or fail ('fail')."""
    if launched_rank() != rank:
        return
    original = Network.forward_backward

    def slowed(self: Network, *args: object, **kwargs: object) -> float:
        if delay == "fail":
            raise RuntimeError(f"rank {rank} failed on purpose")
        start = time.perf_counter()
        loss = original(self, *args, **kwargs)
        spent = time.perf_counter() - start
        time.sleep((float(delay[1:]) - 1) * spent if delay.startswith("x") else float(delay))
        return loss

    Network.forward_backward = slowed  # type: ignore[method-assign]


if __name__ == "__main__":
    setting = os.environ.get("MAGMADNN_SLOW_RANK", "")
    if setting:
        rank, _, delay = setting.partition(":")
        slow_down(int(rank), delay)
    from magmadnn_cli.cli import main
    main()
