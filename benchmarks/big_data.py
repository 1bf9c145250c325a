"""Streamed epochs at scale (issue 48): a generated table of about `--gb` GB as CSV and as Parquet
(number columns with 2% missing cells, two category columns, a binary label; written by pyarrow,
chunk by chunk), trained by `magmadnn train` with data.stream: true under an address-space limit
(`ulimit -v`, default 3 GiB); and a table that fits (`--fits-mb`) trained both ways, for the rows/s
of the in-memory path. Each run is its own process; its peak RSS is read from wait4.

On the table that fits, the in-memory run and the streamed variants (as is; without the cache of
encoded rows, blocks parsed ahead or not; cached blocks read ahead) run in turn `--repeats` times, and their epoch rows/s are
compared by medians (the load of a shared machine drifts; the load average is printed with each).
The streamed runs over the big table make both fitting passes over the whole file; their epoch (and
final evaluation) is bounded to the file's first `--blocks` blocks when a whole epoch would take too
long on a shared machine (the child keeps those blocks after fitting; 0: the whole file).

--ranks N also trains the table that fits, streamed, in float64 on 1 process and on N ranks, and prints the
weights' largest difference (N ranks give one process's weights: to 1e-12).

    python benchmarks/big_data.py [--gb 10] [--fits-mb 300] [--repeats 3] [--variants stream,no-cache,no-cache-no-ahead,ahead]
                                  [--blocks 24] [--limit-gb 3] [--folder /tmp/big_data] [--keep] [--ranks 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

NUMBERS, KINDS, CHUNK_ROWS = 24, 40, 250_000
CONFIG = """\
name: big-data
seed: 0
data: {{train: {table}, target: label, validation_split: 0.02, test_split: 0.02, stream: {stream}}}
model:
  layers:
    - {{type: dense, units: 32, activation: relu}}
    - {{type: dense, units: 2, activation: softmax}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.001}}
training: {{epochs: 1, batch_size: 256, checkpoint: false}}
"""


def chunk(rng: np.random.Generator, rows: int):
    """One pyarrow table of generated rows (vectorized: no per-row Python)."""
    import pyarrow as pa
    x = rng.standard_normal((rows, NUMBERS)).round(4)
    kind, group = rng.integers(0, KINDS, rows), rng.integers(0, 3, rows)
    label = np.where(x[:, 0] + x[:, 1] - x[:, 2] + (kind % 7 == 2) - (group == 1) > 0, "yes", "no")
    columns = {f"n{i}": pa.array(x[:, i], mask=rng.random(rows) < 0.02) for i in range(NUMBERS)}
    columns["kind"] = pa.array(np.char.add("k", kind.astype(str)), mask=rng.random(rows) < 0.02)
    columns["group"] = pa.array(np.array(["north", "south", "east"])[group])
    columns["label"] = pa.array(label)
    return pa.table(columns)


def generate(folder: Path, name: str, size: float, seed: int, parquet: bool) -> tuple[Path, Path | None, int]:
    """A CSV of about `size` bytes (and the same rows as Parquet, a row group per chunk); its rows.
    Files kept (--keep) from an earlier run with the same size and seed are used again."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    rng, rows = np.random.default_rng(seed), 0
    csv_path, pq_path = folder / f"{name}.csv", (folder / f"{name}.parquet") if parquet else None
    made = folder / f"{name}.json"  # what the kept files are: written last, once they are whole
    if made.exists() and json.loads(made.read_text())["made"] == [size, seed, parquet]:
        return csv_path, pq_path, json.loads(made.read_text())["rows"]
    made.unlink(missing_ok=True)  # the files about to be written are no longer what it says
    first = chunk(rng, 1)
    with open(csv_path, "wb") as f, pacsv.CSVWriter(f, first.schema) as out:
        writer = pq.ParquetWriter(pq_path, first.schema) if pq_path else None
        while f.tell() < size:
            table = chunk(rng, CHUNK_ROWS)
            out.write_table(table)
            if writer:
                writer.write_table(table, row_group_size=CHUNK_ROWS)
            rows += table.num_rows
        if writer:
            writer.close()
    made.write_text(json.dumps({"made": [size, seed, parquet], "rows": rows}))
    return csv_path, pq_path, rows


VARIANTS = {"memory": "in memory", "stream": "streamed", "no-cache": "streamed, no cache (blocks parsed ahead)",
            "no-cache-no-ahead": "streamed, no cache, nothing ahead", "ahead": "streamed, cached blocks read ahead"}


def child(config: Path, out: Path, blocks: int, variant: str = "stream") -> None:
    """In the measured process: `magmadnn train`, its streamed epoch bounded to the first `blocks`
    blocks (after both fitting passes over the whole file) when `blocks` > 0; `variant` no-cache:
    each pass parses the file again (data/stream_cache.py off), the next blocks in a thread;
    no-cache-no-ahead: each block parsed when its step needs it; ahead: cached blocks read ahead in
    a thread too (what StreamSource.ahead leaves out)."""
    if blocks > 0:
        bound_epoch(blocks)
    if variant.startswith("no-cache"):
        from magmadnn_cli.data import stream_cache
        stream_cache.room_for = lambda nbytes, folder=None: False
    if variant == "no-cache-no-ahead":
        from magmadnn_cli.data.stream_prepare import StreamSource
        StreamSource.ahead = lambda self, order, code: self.close()
    if variant == "ahead":
        read_ahead_always()
    from magmadnn_cli import cli
    sys.argv = ["magmadnn", "train", str(config), "--out", str(out), "-q", "--overwrite"]
    cli.main()


def read_ahead_always() -> None:
    from magmadnn_cli.data import stream
    from magmadnn_cli.data.stream_prepare import StreamSource

    def ahead(self, order, code):
        self.close()
        read = self.file.reader()
        self._ahead = (code, stream.Prefetcher(lambda block: self._encoded(read, block, code), order))
    StreamSource.ahead = ahead


def bound_epoch(blocks: int) -> None:
    from magmadnn_cli.data import stream_prepare
    from magmadnn_cli.data.prepare import Split
    from magmadnn_cli.training import builder
    fitted = stream_prepare.prepare_streamed

    def first_blocks(cfg, task, seed, block_bytes=None, **ranks):
        data = fitted(cfg, task, seed, block_bytes, **ranks)
        source = data.train.x.source
        source.blocks = source.blocks[:blocks]
        counts = sum(np.bincount(source.codes(b), minlength=3) for b in source.blocks)
        for name, code in stream_prepare.SPLIT_CODES.items():
            split = getattr(data, name)
            if split is not None:
                x = stream_prepare.InOrder(source, code, int(counts[code]), split.x.shape[1], split.x.dtype)
                setattr(data, name, Split(x, split.y[:counts[code]]))
        return data

    builder.prepare_streamed = first_blocks


def measured(config: Path, out: Path, blocks: int, limit_gb: float, variant: str) -> dict:
    """One run in its own process under the address-space limit: wall seconds, peak RSS, its metrics."""
    def limit() -> None:
        if limit_gb:
            size = int(limit_gb * 2 ** 30)
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
    start = time.perf_counter()
    log = out.parent / f"{out.name}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(config), str(out), str(blocks), variant],
                                preexec_fn=limit, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{config}: exit {proc.returncode}\n{log.read_text()[-4000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    epoch = [row for row in csv.DictReader(open(out / "metrics.csv"))][-1]
    return {"seconds": seconds, "epoch_s": float(epoch["time"]), "metrics": metrics, "peak": usage.ru_maxrss / 1024}


def run(folder: Path, table: Path, variant: str, blocks: int, limit_gb: float, rows: int) -> dict:
    stream = variant != "memory"
    config = folder / f"{table.stem}_{table.suffix[1:]}_{stream}.yaml"
    config.write_text(CONFIG.format(table=table, stream=str(stream).lower()))
    result = measured(config, folder / f"run_{config.stem}_{variant}", blocks, limit_gb, variant)
    train = result["metrics"]["train"]["per_class"]
    trained = sum(c["support"] for c in train.values())
    result.update(trained=trained, epoch_rate=trained / result["epoch_s"], run_rate=rows / result["seconds"])
    bound = "all" if blocks <= 0 else blocks
    print(f"{table.name:18} {VARIANTS[variant]:40} limit {limit_gb or '-'} GiB  blocks {bound:>4}: "
          f"{trained:,} training rows, epoch {result['epoch_s']:.1f} s = {result['epoch_rate']:,.0f} rows/s; "
          f"whole run {result['seconds']:.1f} s; peak RSS {result['peak']:,.0f} MiB; "
          f"val accuracy {result['metrics']['validation']['accuracy']:.3f}; load {os.getloadavg()[0]:.1f}", flush=True)
    return result


def interleaved(folder: Path, table: Path, rows: int, variants: list[str], repeats: int) -> None:
    """Each variant's epoch rows/s on the table that fits, the variants run in turn `repeats` times
    (a shared machine's load drifts), with their medians and ratios to the in-memory path's."""
    rates: dict[str, list[float]] = {v: [] for v in variants}
    loads = []
    for _ in range(repeats):
        for variant in variants:
            loads.append(os.getloadavg()[0])
            rates[variant].append(run(folder, table, variant, 0, 0, rows)["epoch_rate"])
    memory = float(np.median(rates["memory"]))
    for variant, found in rates.items():
        print(f"{VARIANTS[variant]:40} epoch rows/s median {np.median(found):,.0f} (runs {', '.join(f'{r:,.0f}' for r in found)}): "
              f"{np.median(found) / memory:.2f}x in memory", flush=True)
    print(f"load average (1 min) before each run: {min(loads):.1f}-{max(loads):.1f}, median {np.median(loads):.1f}", flush=True)


def ranks_check(folder: Path, table: Path, ranks: int) -> None:
    """The same streamed run in float64 on 1 process and on `ranks` (`--processes`): the weights'
    largest difference (the promise: one process's weights, to 1e-12)."""
    config = folder / f"{table.stem}_ranks.yaml"
    config.write_text(CONFIG.format(table=table, stream="true").replace("seed: 0\n", "seed: 0\nprecision: float64\n"))
    weights = []
    for count in (1, ranks):
        out = folder / f"run_{table.stem}_ranks{count}"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(out), "-q", "--overwrite",
                        *(["--processes", str(count)] if count > 1 else [])], check=True, capture_output=True)
        print(f"{table.name}: float64, streamed, {count} process(es): {time.perf_counter() - start:.0f} s", flush=True)
        with np.load(out / "model.npz", allow_pickle=False) as saved:
            weights.append({k: saved[k] for k in saved.files if k.startswith("weights/")})
    largest = max(float(np.max(np.abs(weights[0][k] - weights[1][k]))) for k in weights[0])
    print(f"{table.name}: {ranks} ranks' weights against 1 process's: largest difference {largest:.3g} "
          f"({'within' if largest <= 1e-12 else 'BEYOND'} 1e-12)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=10.0, help="the big table's size (0: none)")
    parser.add_argument("--fits-mb", type=float, default=300.0)
    parser.add_argument("--blocks", type=int, default=24, help="the big runs' epoch: the first N blocks (0: all)")
    parser.add_argument("--limit-gb", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3, help="turns of the runs on the table that fits")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)} (memory is always run)")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/big_data"))
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--ranks", type=int, default=0, help="also train the table that fits on 1 process and on N "
                        "ranks in float64 and compare the weights (0: not)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child[0]), Path(args.child[1]), int(args.child[2]), args.child[3])
    args.folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.folder).free
    if free < 3.5 * args.gb * 1e9:  # the CSV, its Parquet (smaller), the streamed runs' cache and room to spare
        raise SystemExit(f"{args.folder}: {free / 1e9:.0f} GB free; {3.5 * args.gb:.0f} GB needed for --gb {args.gb}")
    try:
        start = time.perf_counter()
        small, _, small_rows = generate(args.folder, "fits", args.fits_mb * 1e6, 1, parquet=False)
        print(f"generated {small.name} {small.stat().st_size / 1e6:,.0f} MB ({small_rows:,} rows) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        variants = ["memory"] + [v for v in args.variants.split(",") if v in VARIANTS and v != "memory"]
        if args.repeats > 0:
            interleaved(args.folder, small, small_rows, variants, args.repeats)
        if args.ranks > 1:
            ranks_check(args.folder, small, args.ranks)
        if args.gb > 0:
            big_runs(args, small_rows)
    finally:
        if not args.keep:
            shutil.rmtree(args.folder, ignore_errors=True)


def big_runs(args: argparse.Namespace, small_rows: int) -> None:
    """The big table as CSV and Parquet, streamed under the address-space limit (epoch bounded to
    --blocks blocks), against one in-memory run on the table that fits, just before."""
    start = time.perf_counter()
    big, big_pq, big_rows = generate(args.folder, "big", args.gb * 1e9, 0, parquet=True)
    print(f"generated in {time.perf_counter() - start:.0f} s: {big.name} {big.stat().st_size / 1e9:.2f} GB and "
          f"{big_pq.name} {big_pq.stat().st_size / 1e9:.2f} GB ({big_rows:,} rows)", flush=True)
    for table in (big, big_pq):
        memory = run(args.folder, args.folder / "fits.csv", "memory", 0, 0, small_rows)
        big_run = run(args.folder, table, "stream", args.blocks, args.limit_gb, big_rows)
        print(f"{table.name}: streamed epoch {big_run['epoch_rate'] / memory['epoch_rate']:.2f}x the in-memory "
              f"rows/s on the table that fits; fitting passes and the rest {big_run['seconds'] - big_run['epoch_s']:.0f} s",
              flush=True)


if __name__ == "__main__":
    main()
