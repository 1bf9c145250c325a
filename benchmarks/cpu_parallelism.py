"""Can one process use both cores for a CNN step? The LeNet-5 step (batch 64) run five ways in one
run, in alternating rounds: whole, in this process; as two half-batch steps in two Python threads
(OpenBLAS pinned to one thread, so the pools do not fight); as two half-batch steps in two processes
at once (what `--processes 2` runs, minus the gradient allreduce); and PyTorch CPU (when installed)
on all cores and on one. Each row is milliseconds per full batch and its ratio to PyTorch's.

    python benchmarks/cpu_parallelism.py [--steps 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels (core/cpu_kernels.py) as a run does

from magmadnn_cli.core.blas import _library

from conv import best, lenet, ours, torch_step  # benchmarks/ is the script's folder


def lenet_step(batch: int):
    # the CPU in float32: the backend outside any run
    layers, shape, _, loss = lenet(batch)
    return ours(layers, shape, batch, loss, "gemm")[0]


@contextmanager
def openblas_threads(count: int):
    """OpenBLAS's thread count for the block (numpy's bundled build), restored after."""
    lib = _library()
    setter = getattr(lib, "scipy_openblas_set_num_threads64_", None) if lib else None
    if setter is None:
        yield
        return
    before = lib.scipy_openblas_get_num_threads64_()
    setter(ctypes.c_int64(count))
    try:
        yield
    finally:
        setter(ctypes.c_int64(before))


def threads(steps: int) -> float:
    halves = [lenet_step(32), lenet_step(32)]
    with ThreadPoolExecutor(1) as pool, openblas_threads(1):
        def pair() -> None:
            other = pool.submit(halves[1])
            halves[0]()
            other.result()
        return best(pair, steps)


def _half_in_process(steps: int, start, results) -> None:
    with openblas_threads(1):
        step = lenet_step(32)
        step()
        start.wait()
        results.put(best(step, steps))


def processes(steps: int) -> float:
    """Seconds per half-batch step while two processes run theirs at the same time."""
    context = mp.get_context("spawn")
    start, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_half_in_process, args=(steps, start, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    times = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return max(times)


def torch_one_thread(step, steps: int) -> float:
    import torch  # only when installed; torch_step returned a step
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return best(step, steps)
    finally:
        torch.set_num_threads(threads_before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    whole, torch = lenet_step(64), torch_step("lenet5", 64)
    runs: dict[str, list[float]] = {"one process, whole batch": [], "two threads, half batch each": [],
                                    "two processes, half batch each": [], "PyTorch CPU": [],
                                    "PyTorch CPU, one thread": []}
    for _ in range(args.rounds):
        runs["one process, whole batch"].append(best(whole, args.steps))
        runs["two threads, half batch each"].append(threads(args.steps))
        runs["two processes, half batch each"].append(processes(args.steps))
        if torch:
            runs["PyTorch CPU"].append(best(torch, args.steps))
            runs["PyTorch CPU, one thread"].append(torch_one_thread(torch, args.steps))
    reference = min(runs["PyTorch CPU"]) if torch else None
    print(f"{'LeNet-5 step, batch 64':<34} {'best ms':>8} {'rounds ms':>22} {'x PyTorch':>9}")
    for label, times in runs.items():
        if not times:
            continue
        ratio = f"{min(times) / reference:>9.2f}" if reference else f"{'-':>9}"
        rounds = " ".join(f"{t * 1e3:.2f}" for t in times)
        print(f"{label:<34} {min(times) * 1e3:>8.2f} {rounds:>22} {ratio}")


if __name__ == "__main__":
    main()
