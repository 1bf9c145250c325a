"""A node's memory for the prepared training data under 1, 2 and 4 ranks (issue 48, item 1): every
rank preparing its own copy (the old way, `on_every_rank`) against one copy per node in MPI shared
memory (`once_per_node`, what `train` does now). The table is generated as Parquet: numbers, one
category column and missing cells; its encoded size is about --encoded-mb. Each rank measures itself
from /proc/self/smaps_rollup once all ranks hold the data: the node's memory is the sum of the ranks'
PSS (shared pages counted once, split between the ranks that map them); peak = the sum of VmHWM.

    python benchmarks/node_memory.py [--encoded-mb 2048] [--ranks 1,2,4] [--folder /tmp/node_memory]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import magmadnn_cli  # noqa: F401  first: it picks OpenBLAS's kernels as a run does
import numpy as np

NUMBERS, LEVELS = 60, 4  # encoded width: 60 numbers + 4 one-hot levels (float32)
CONFIG = """\
name: node-memory
seed: 0
data: {{train: {table}, target: label, validation_split: 0.1}}
model:
  layers:
    - {{type: dense, units: 3, activation: softmax}}
loss: cross_entropy
optimizer: {{type: sgd, learning_rate: 0.1}}
training: {{epochs: 1, batch_size: 256}}
"""


def generate(folder: Path, encoded_mb: int) -> Path:
    """A Parquet table whose encoded features take about `encoded_mb` MiB (kept between runs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = encoded_mb * 2**20 // ((NUMBERS + LEVELS) * 4)
    path = folder / f"table-{encoded_mb}mb.parquet"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    writer, rng, block = None, np.random.default_rng(0), 200_000
    for lo in range(0, rows, block):
        n = min(block, rows - lo)
        x = rng.standard_normal((n, NUMBERS)).astype(np.float32)
        x[rng.random((n, NUMBERS)) < 0.01] = np.nan  # missing cells: filled, with their own indicator only if many
        columns = {f"f{i}": x[:, i] for i in range(NUMBERS)}
        columns["kind"] = np.array(["a", "b", "c", "d"])[rng.integers(0, LEVELS, n)]
        columns["label"] = np.array(["x", "y", "z"])[(x[:, 0] > 0).astype(int) + (x[:, 1] > 1)]
        table = pa.table(columns)
        writer = writer or pq.ParquetWriter(str(path) + ".tmp", table.schema)
        writer.write_table(table)
    writer.close()
    os.replace(str(path) + ".tmp", path)
    return path


def own_memory() -> dict[str, int]:
    """This process's RSS and PSS (smaps_rollup) and peak RSS (VmHWM), in bytes."""
    found = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            found[key.lower()] = int(rest.split()[0]) * 1024
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            found["peak"] = int(line.split()[1]) * 1024
    return found


def worker(config: str, mode: str) -> None:
    from magmadnn_cli.config.loading import load_config
    from magmadnn_cli.data.prepare import prepare
    from magmadnn_cli.distributed.comm import on_every_rank
    from magmadnn_cli.distributed.mpi import MPICommunicator
    from magmadnn_cli.distributed.shared import once_per_node

    comm = MPICommunicator()
    cfg = load_config(config)
    base = comm.allgather(own_memory()["pss"])  # the per-rank constant: interpreter, numpy, MPI
    make = lambda: prepare(cfg.data, cfg.loss.task, 0)  # noqa: E731
    data = once_per_node(comm, make) if mode == "node" and comm.size > 1 else on_every_rank(comm, make)
    touched = float(data.train.x.sum()) + float(data.validation.x.sum())  # every rank reads all its data
    comm.barrier()
    measured = comm.allgather(own_memory())
    comm.barrier()  # every rank alive while the others measure
    if comm.is_root:
        total = {k: sum(m[k] for m in measured) for k in measured[0]} | {"base": sum(base)}
        print(json.dumps({"ranks": comm.size, "mode": mode, "encoded_mb": round(data.train.x.nbytes / 2**20
                                                                                + data.validation.x.nbytes / 2**20),
                          "finite": bool(np.isfinite(touched)), **total}))


def measure(config: Path, ranks: int, mode: str) -> dict:
    from magmadnn_cli.distributed.launcher import locate_mpi_launcher
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MAGMADNN_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([locate_mpi_launcher(), "-n", str(ranks), sys.executable, __file__, "--worker", mode,
                           str(config)], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoded-mb", type=int, default=2048)
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/node_memory"))
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[1], args.worker[0])
    table = generate(args.folder, args.encoded_mb)
    config = args.folder / "config.yaml"
    config.write_text(CONFIG.format(table=table))
    one = measure(config, 1, "node")
    gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
    print(f"encoded training + validation data: {one['encoded_mb']} MiB; one process: PSS {gib(one['pss'])} GiB "
          f"(before reading: {gib(one['base'])}), peak {gib(one['peak'])} GiB")
    print("ranks  mode        node PSS GiB  x one  less ranks' constant: x one  sum RSS GiB  sum peak GiB")
    for ranks in (int(r) for r in args.ranks.split(",") if int(r) > 1):
        for mode in ("every_rank", "node"):
            got = measure(config, ranks, mode)
            data = (got["pss"] - got["base"]) / (one["pss"] - one["base"])  # goal (node): at most 1.2
            print(f"{ranks:5d}  {mode:10s}  {gib(got['pss']):>12s}  {got['pss'] / one['pss']:5.2f}  {data:26.2f}  "
                  f"{gib(got['rss']):>11s}  {gib(got['peak']):>12s}")


if __name__ == "__main__":
    main()
