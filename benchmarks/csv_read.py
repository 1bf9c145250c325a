"""CSV reading speed and predict's memory on wide rows.

  MB/s of `data.readers.read_csv` on the shipped MNIST CSV (5000 rows x 785 columns, 9.1 MB unpacked)
  and on a generated file of --size-mb (784-column rows), with pyarrow's reader as a reference when
  it is installed; then the peak resident memory of `magmadnn predict` on that wide file.

    python benchmarks/csv_read.py [--size-mb 200]
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def best_seconds(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def pyarrow_reader():
    try:
        import pyarrow.csv as pc  # a reference, when installed
    except ImportError:
        return None
    return lambda path: pc.read_csv(path)


def wide_file(folder: Path, size_mb: int) -> Path:
    path = folder / "wide.csv"
    rng = np.random.default_rng(0)
    header = ",".join([f"pixel{i}" for i in range(784)] + ["label"]) + "\n"
    block = "\n".join(",".join(map(str, row)) for row in rng.integers(0, 256, (500, 785))) + "\n"
    with open(path, "w") as f:
        f.write(header)
        while f.tell() < size_mb * 1e6:
            f.write(block)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    args = parser.parse_args()
    from magmadnn_cli.data.readers import ReadSpec, read_csv
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        mnist = folder / "mnist_5k.csv"
        mnist.write_bytes(gzip.decompress((ROOT / "datasets" / "mnist_5k.csv.gz").read_bytes()))
        wide = wide_file(folder, args.size_mb)
        arrow = pyarrow_reader()
        print(f"{'file':<16} {'MB':>7} {'ours MB/s':>10} {'pyarrow MB/s':>13}")
        for path, repeats in ((mnist, 3), (wide, 1)):
            mb = path.stat().st_size / 1e6
            ours = best_seconds(lambda: read_csv(path, ReadSpec("label")), repeats)
            ref = f"{mb / best_seconds(lambda: arrow(path), repeats):13.1f}" if arrow else f"{'(absent)':>13}"
            print(f"{path.name:<16} {mb:7.1f} {mb / ours:10.1f} {ref}")
        model = folder / "run"
        config = folder / "c.yaml"
        config.write_text(f"name: w\nseed: 0\ndevice: cpu\ndata: {{train: {mnist}, target: label, normalize: standard}}\n"
                          "model: {layers: [{type: dense, units: 10, activation: softmax}]}\nloss: cross_entropy\n"
                          "optimizer: sgd\ntraining: {epochs: 1, checkpoint: false}\n")
        subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(config), "--out", str(model), "-q"], check=True)
        probe = ("import resource, sys, time\nfrom magmadnn_cli.cli import main\nsys.argv = sys.argv[1:]\n"
                 "start = time.perf_counter()\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
                 "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
                 "print(time.perf_counter() - start, hwm)")  # VmHWM: this process image's peak (ru_maxrss
        # would carry the benchmark's own peak over fork + exec)
        out = subprocess.run([sys.executable, "-c", probe, "magmadnn", "predict", str(model / "model.npz"), str(wide),
                              "-o", str(folder / "p.csv")], check=True, capture_output=True, text=True).stdout
        seconds, peak_kb = out.split()[-2:]
        print(f"predict on {wide.stat().st_size / 1e6:.0f} MB of 784-column rows: {float(seconds):.1f} s, "
              f"peak resident memory {int(peak_kb) / 1024:.0f} MB")


if __name__ == "__main__":
    main()
