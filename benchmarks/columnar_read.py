"""The same table as CSV and as Parquet: read speed (MB/s of the CSV's text) and peak memory.

  A table of --mb megabytes of CSV text (numeric feature columns, a text category, a label) is
  written as CSV and as Parquet; each is read whole by magmadnn's reader (`read_table`, what `train`
  does) in a fresh process, best of --repeats, with its peak resident memory; then `predict` streams
  both files (peak memory of the whole command). Ratios are measured in this one run.

    python benchmarks/columnar_read.py [--mb 1000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FEATURES = 10

READ = """
import json, resource, sys, time
from pathlib import Path
from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data.readers import ReadSpec, read_table
path = Path(sys.argv[1])
start = time.perf_counter()
table = read_table(path, ReadSpec.of(DataConfig(train=path, target="label")))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rows": len(table.x),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_table(folder: Path, mb: int) -> tuple[Path, Path]:
    """The CSV (about `mb` MB) and the same rows as Parquet, written in blocks."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    csv, parquet = folder / "table.csv", folder / "table.parquet"
    writer, written = None, 0
    with open(csv, "wb") as sink:
        while written < mb * 1e6:
            rows = 200_000
            block = {f"f{i}": np.round(rng.normal(size=rows), 4) for i in range(FEATURES)}
            block["site"] = rng.choice(["north", "south", "east", "west"], size=rows)
            block["label"] = np.where(block["f0"] + block["f1"] > 0, "yes", "no")
            table = pa.table(block)
            pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=writer is None))
            writer = writer or pq.ParquetWriter(parquet, table.schema)
            writer.write_table(table)
            written = sink.tell()
    writer.close()
    return csv, parquet


def read_in_fresh_process(path: Path, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", READ, str(path)], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout))
    return min(runs, key=lambda r: r["seconds"])


def predict_peak_mb(model: Path, data: Path, out: Path) -> tuple[float, float]:
    """(seconds, peak MB) of `magmadnn predict MODEL DATA -o OUT` in a child process."""
    code = ("import resource, subprocess, sys, time; s = time.perf_counter(); subprocess.run(sys.argv[1:], "
            "check=True); print(time.perf_counter() - s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    done = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "magmadnn_cli", "predict", str(model),
                           str(data), "-o", str(out)], capture_output=True, text=True, check=True)
    seconds, peak = done.stdout.split()
    return float(seconds), float(peak)


def small_model(folder: Path, csv: Path) -> Path:
    head = folder / "head.csv"
    with open(csv) as src, open(head, "w") as dst:
        for _, line in zip(range(5001), src):
            dst.write(line)
    (folder / "c.yaml").write_text(f"name: bench\nseed: 0\ndevice: cpu\ndata: {{train: {head}, target: label}}\n"
                                   "model: {layers: [{type: dense, units: 16, activation: relu}, "
                                   "{type: dense, units: 1, activation: sigmoid}]}\nloss: binary_cross_entropy\noptimizer: {type: adam}\n"
                                   "training: {epochs: 1, checkpoint: false}\n")
    subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(folder / "c.yaml"), "--out",
                    str(folder / "run"), "-q"], check=True, capture_output=True)
    return folder / "run" / "model.npz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        csv, parquet = write_table(folder, args.mb)
        text_mb = csv.stat().st_size / 1e6
        print(f"table: {text_mb:.0f} MB of CSV, {parquet.stat().st_size / 1e6:.0f} MB of Parquet "
              f"({FEATURES} numbers, a category, a label per row; written in {time.perf_counter() - start:.0f} s)")
        results = {name: read_in_fresh_process(path, args.repeats) for name, path in (("csv", csv), ("parquet", parquet))}
        for name, r in results.items():
            print(f"read whole, {name:8s}: {r['rows']:,} rows in {r['seconds']:.2f} s = {text_mb / r['seconds']:.0f} MB/s "
                  f"of CSV text; peak {r['peak_mb']:.0f} MB")
        print(f"Parquet vs CSV: {results['csv']['seconds'] / results['parquet']['seconds']:.2f}x faster, "
              f"{results['parquet']['peak_mb'] / results['csv']['peak_mb']:.2f}x the peak memory")
        model = small_model(folder, csv)
        for name, path in (("csv", csv), ("parquet", parquet)):
            seconds, peak = predict_peak_mb(model, path, folder / f"p_{name}.parquet")
            print(f"predict (streamed), {name:8s}: {seconds:.1f} s, peak {peak:.0f} MB "
                  f"({peak / text_mb:.2f} MB per MB of CSV text)")


if __name__ == "__main__":
    main()
