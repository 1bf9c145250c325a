"""OpenBLAS's kernel sets on this CPU, measured in one run: GEMMs of the shapes magmadnn trains with
(the paper MLP's layers at 100 and 200 rows, forward and transposed, LeNet-5's convolution
products, a square one) and the paper MLP's whole training step, under OpenBLAS's own choice and
under the one `core/cpu_kernels.py` asks for (Haswell on AMD Zen 4), one BLAS thread, each set in its
own process (OpenBLAS picks kernels when it loads), rounds alternating. Prints ms (best of the
rounds) and chosen / own: below 1 means the choice is faster.

    python benchmarks/blas_kernels.py [--rounds 3] [--dtype float32] [--against Haswell]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [  # (label, M, K, N, form): the product is M x N over K; A^T B is a weight gradient, A B^T an input's
    ("MLP layer 1, 100 rows", 100, 784, 528, "AB"), ("MLP layer 2, 100 rows", 100, 528, 528, "AB"),
    ("MLP layer 2, 200 rows", 200, 528, 528, "AB"), ("MLP input grad (dz W^T), 100 rows", 100, 528, 528, "ABT"),
    ("MLP weight grad (x^T dz), 200 rows", 528, 200, 528, "ATB"), ("LeNet conv1, 32 rows", 6, 25, 28672, "AB"),
    ("LeNet conv2, 32 rows", 16, 150, 3200, "AB"), ("square 1024", 1024, 1024, 1024, "AB"),
]


def _best_ms(fn, seconds: float = 0.3) -> float:
    fn()
    reps, best = 1, float("inf")
    while True:  # enough repeats for ~seconds / 5 a batch, best of 5 batches
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        took = time.perf_counter() - start
        if took > seconds / 5:
            break
        reps *= 2
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return best * 1e3


def _mlp_step_ms(dtype: str) -> float:
    import numpy as np

    from magmadnn_cli.core import backend as B
    from magmadnn_cli.nn.layers import Dense
    from magmadnn_cli.nn.losses import CrossEntropy
    from magmadnn_cli.nn.network import Network

    with B.using(B.cpu(dtype)):
        net = Network([Dense.of(units=528, activation="sigmoid") for _ in range(3)]
                      + [Dense.of(units=10, activation="softmax")], (784,), CrossEntropy(), seed=0)
        rng = np.random.default_rng(0)
        x, y = rng.random((200, 784)).astype(dtype), rng.integers(0, 10, 200)
        positions = np.arange(200)
        return _best_ms(lambda: net.forward_backward(x, y, 1.0, positions, key=0), 1.0)


def worker(dtype: str) -> None:
    import numpy as np  # first: magmadnn_cli then leaves the kernels this process was given alone

    from magmadnn_cli.core.blas import kernel_name

    rng = np.random.default_rng(0)
    times = {}
    for label, m, k, n, form in SHAPES:
        a = rng.random((k, m) if form == "ATB" else (m, k)).astype(dtype)
        b = rng.random((n, k) if form == "ABT" else (k, n)).astype(dtype)
        times[label] = _best_ms({"AB": lambda: a @ b, "ATB": lambda: a.T @ b, "ABT": lambda: a @ b.T}[form])
    times["paper MLP training step, 200 rows"] = _mlp_step_ms(dtype)
    print(json.dumps({"kernels": kernel_name(), "ms": times}))


def run(coretype: str | None, dtype: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    done = subprocess.run([sys.executable, __file__, "--worker", "--dtype", dtype], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--against", default=None, help="the kernel set to compare with OpenBLAS's own "
                        "(default: what magmadnn asks for on this CPU)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.dtype)
    from magmadnn_cli.core import cpu_kernels
    choice = args.against or (cpu_kernels.preferred(cpu_kernels.cpuinfo()) or (None,))[0]
    if choice is None:
        print("magmadnn keeps OpenBLAS's own kernels on this CPU; name a set with --against (e.g. Haswell)")
        return
    own, chosen = [], []
    for _ in range(args.rounds):
        own.append(run(None, args.dtype))
        chosen.append(run(choice, args.dtype))
    print(f"{args.dtype}, 1 BLAS thread, best of {args.rounds} rounds: OpenBLAS's own {own[0]['kernels']} "
          f"vs {chosen[0]['kernels']}")
    print(f"{'':38s} {'own ms':>9s} {'chosen ms':>10s} {'chosen/own':>11s}")
    for label in own[0]["ms"]:
        a, b = min(r["ms"][label] for r in own), min(r["ms"][label] for r in chosen)
        print(f"{label:38s} {a:9.3f} {b:10.3f} {b / a:11.2f}")


if __name__ == "__main__":
    main()
