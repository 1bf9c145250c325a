"""A folder of PNG (or JPEG) files as training data: images per second for the first epoch (decoding),
a later epoch (batches gathered from the decoded pixels) and a later run (the decoded-image cache), beside
torchvision's ImageFolder + DataLoader(num_workers=cores) on the same files when it is installed; and
`magmadnn train` from the folder against the same images as an NPZ.

  --images files of each --format (10 classes of RGB --size x --size pixels) are written to a temporary
  folder (deleted after), with the same pixels as one NPZ. Each read runs in a fresh process (a cold
  start, as a run has). Ours and torchvision's first epochs alternate (ABAB, --repeats pairs), so a
  busy machine's drift falls on both; rates are medians, and the ratio is the median of the pairs'
  ratios. torchvision runs in --torchvision PYTHON (an interpreter with torch and torchvision, e.g. a
  separate venv; default: this one where it has them), timed from building the ImageFolder (its
  listing) to the epoch's last batch. Training runs (first run, cached run, NPZ) alternate too,
  --train-repeats times; medians. Goals (issue 46): first epoch >= torchvision's; a cached epoch >= 5x
  the first; training from the folder within 10% of training from the NPZ.

    python benchmarks/image_folder.py [--images 3000] [--size 32] [--format png,jpeg] [--repeats 5]
                                      [--train-repeats 3] [--torchvision /path/to/venv/bin/python]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CLASSES = 10
BATCH = 128

READ = """
import json, sys, time
import numpy as np
from pathlib import Path
from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data.readers import ReadSpec, read_table
path = Path(sys.argv[1])
start = time.perf_counter()
table = read_table(path, ReadSpec.of(DataConfig(train=path)))
read = time.perf_counter() - start
x, order = table.x, np.random.default_rng(0).permutation(len(table.x))
start = time.perf_counter()
for lo in range(0, len(x), int(sys.argv[2])):  # an epoch's batches, gathered as the trainer gathers them
    batch = x[order[lo:lo + int(sys.argv[2])]] * np.float32(1 / 255)
epoch = time.perf_counter() - start
print(json.dumps({"read": read, "epoch": epoch, "images": len(x), "notes": table.notes}))
"""

TORCH = """
import json, os, sys, time
import torch
import torchvision
from torchvision import datasets, transforms
start = time.perf_counter()
data = datasets.ImageFolder(sys.argv[1], transform=transforms.ToTensor())
loader = torch.utils.data.DataLoader(data, batch_size=int(sys.argv[2]), shuffle=True,
                                     num_workers=len(os.sched_getaffinity(0)))
count = sum(len(x) for x, _ in loader)
print(json.dumps({"epoch": time.perf_counter() - start, "images": count,
                  "versions": [torch.__version__, torchvision.__version__]}))
"""

CONFIG = """
name: bench_images
seed: 0
data: {{train: {train}, validation_split: 0.1}}
model:
  layers:
    - {{type: conv2d, filters: 8, kernel_size: 3, padding: same, activation: relu}}
    - {{type: pool2d, mode: max, pool_size: 2}}
    - {{type: flatten}}
    - {{type: dense, units: {classes}, activation: softmax}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.001}}
training: {{epochs: {epochs}, batch_size: {batch}}}
"""


def write_images(folder: Path, count: int, size: int, fmt: str) -> tuple[Path, Path]:
    """`count` images in CLASSES class folders, and the same pixels and labels as x.npz (uint8, NCHW)."""
    from PIL import Image
    rng = np.random.default_rng(0)
    root, xs, ys = folder / "train", [], []
    for i in range(count):
        label = i % CLASSES
        base = rng.integers(0, 256, size=(1, 1, 3)) * np.ones((size, size, 1))
        pixels = np.clip(base + rng.normal(0, 40, size=(size, size, 3)), 0, 255).astype(np.uint8)
        (root / f"c{label}").mkdir(parents=True, exist_ok=True)
        path = root / f"c{label}" / f"{i:06d}.{'png' if fmt == 'png' else 'jpg'}"
        Image.fromarray(pixels).save(path, **({"quality": 90} if fmt == "jpeg" else {}))
        xs.append(np.asarray(Image.open(path).convert("RGB")).transpose(2, 0, 1))
        ys.append(f"c{label}")
    order = np.argsort(ys, kind="stable")  # the folder's order: classes sorted, then files
    np.savez(folder / "same.npz", x=np.stack(xs)[order], y=np.array(ys)[order])
    return root, folder / "same.npz"


def python(code: str, *args: str, env: dict[str, str], interpreter: str = sys.executable) -> dict:
    out = subprocess.run([interpreter, "-c", code, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def first_epochs(root: Path, repeats: int, env: dict[str, str], cache: Path, torch: str | None) -> dict:
    """Our first epoch (an empty cache: decoding) and torchvision's, alternating `repeats` times; then
    later runs (the cache): images/s, medians; the median of the pairs' ratios to torchvision."""
    ours, theirs = [], []
    clean = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    for _ in range(repeats):
        for stale in cache.glob("*"):
            stale.unlink()
        ours.append(python(READ, str(root), str(BATCH), env=env))
        if torch:
            theirs.append(python(TORCH, str(root), str(BATCH), env=clean, interpreter=torch))
    later = [python(READ, str(root), str(BATCH), env=env) for _ in range(repeats)]
    assert any("read from the cache" in note for note in later[0]["notes"]), later[0]["notes"]
    n = ours[0]["images"]
    first = [n / (r["read"] + r["epoch"]) for r in ours]
    rates = {"first_epoch": statistics.median(first), "later_epoch": n / median(later, "epoch"),
             "later_run": statistics.median(n / (r["read"] + r["epoch"]) for r in later),
             "first_epoch_each": [round(r) for r in first]}
    if not theirs:
        return {"images_per_s": rates, "torchvision": "not installed: not compared"}
    epochs = [r["images"] / r["epoch"] for r in theirs]
    return {"images_per_s": rates, "torchvision": {
        "epoch": statistics.median(epochs), "epoch_each": [round(r) for r in epochs], "versions": theirs[0]["versions"],
        "first_epoch_over_torchvision": statistics.median(a / b for a, b in zip(first, epochs)),
        "cached_epoch_over_torchvision": rates["later_epoch"] / statistics.median(epochs)}}


def torch_python(given: str | None) -> str | None:
    """The interpreter that runs torchvision: the one given, else this one where it has torchvision."""
    if given:
        return given
    try:
        import torchvision as _  # noqa: F401  only whether it is installed
    except ImportError:
        return None
    return sys.executable


def train_seconds(source: Path, folder: Path, epochs: int, env: dict[str, str], tag: str) -> tuple[float, float]:
    """Of `magmadnn train` on `source` (a fresh process; the whole command): its wall time and the part
    of it spent in epochs (metrics.csv's time column); the rest is reading the data, setting up and
    the final evaluation."""
    cfg = folder / f"{tag}.yaml"
    cfg.write_text(CONFIG.format(train=source, classes=CLASSES, epochs=epochs, batch=BATCH))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(cfg), "--quiet", "--out",
                    str(folder / f"run-{tag}"), "--overwrite"], check=True, env=env, capture_output=True)
    wall = time.perf_counter() - start
    with open(folder / f"run-{tag}" / "metrics.csv", newline="") as f:
        return wall, sum(float(row["time"]) for row in csv.DictReader(f))


def same_weights(one: Path, two: Path) -> bool:
    """Whether two runs' models hold the same weights, bit for bit."""
    with np.load(one / "model.npz") as a, np.load(two / "model.npz") as b:
        return all(np.array_equal(a[k], b[k]) for k in a.files if k.startswith("weights/"))


def training_from(runs: dict[str, list[tuple[float, float]]]) -> dict:
    """Medians of the whole commands' wall times and of their split: setting up (reading the data) and
    training (the epochs). Training from the folder and from the NPZ is the same computation (the same
    weights, checked), so two ratios say what the folder costs: the wall times' medians, and set-up's
    median difference over the median training time of all runs (steadier on a shared machine)."""
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    setup = {k: statistics.median(w - t for w, t in v) for k, v in runs.items()}
    trained = statistics.median(t for v in runs.values() for _, t in v)
    kinds = ("folder_first_run", "folder_cached_run")
    return {"wall_s": wall, "setup_s": setup, "training_s": trained,
            "folder_over_npz_wall": {k: wall[k] / wall["npz"] for k in kinds},
            "folder_over_npz": {k: (setup[k] + trained) / (setup["npz"] + trained) for k in kinds}}


def measure(folder: Path, fmt: str, args: argparse.Namespace, torch: str | None) -> dict:
    """Every number for `args.images` files of one format, in `folder`."""
    env = {**os.environ, "XDG_CACHE_HOME": str(folder / "cache"), "PYTHONPATH": str(ROOT)}
    cache = folder / "cache" / "magmadnn" / "images"
    root, npz = write_images(folder, args.images, args.size, fmt)
    loads = [os.getloadavg()[0]]
    epochs = first_epochs(root, args.repeats, env, cache, torch)
    loads.append(os.getloadavg()[0])
    runs: dict[str, list[tuple[float, float]]] = {"folder_first_run": [], "folder_cached_run": [], "npz": []}
    for _ in range(args.train_repeats):  # interleaved: a busy machine's drift falls on all three alike
        for stale in cache.glob("*"):
            stale.unlink()
        runs["folder_first_run"].append(train_seconds(root, folder, args.epochs, env, "folder"))
        runs["folder_cached_run"].append(train_seconds(root, folder, args.epochs, env, "folder"))
        runs["npz"].append(train_seconds(npz, folder, args.epochs, env, "npz"))
    loads.append(os.getloadavg()[0])
    rates = epochs["images_per_s"]
    return {"images": args.images, "size": args.size, "format": fmt, **epochs, "train": training_from(runs),
            "same_weights_folder_and_npz": same_weights(folder / "run-folder", folder / "run-npz"),
            "cached_epoch_over_first": rates["later_epoch"] / rates["first_epoch"],
            "cached_run_over_first": rates["later_run"] / rates["first_epoch"], "load_average_1min": loads}


def said(result: dict) -> str:
    """The ratios in a line each."""
    tv, train = result["torchvision"], result["train"]
    lines = [f"{result['format']}: first epoch {result['images_per_s']['first_epoch']:,.0f} images/s"]
    if isinstance(tv, dict):
        lines[0] += f", torchvision {tv['epoch']:,.0f}: {tv['first_epoch_over_torchvision']:.2f}x (median of pairs)"
    for kind in ("folder_first_run", "folder_cached_run"):
        lines.append(f"{result['format']}: training from the folder ({kind.split('_')[1]} run) over the NPZ: "
                     f"{train['folder_over_npz'][kind]:.2f}x (set-up split), {train['folder_over_npz_wall'][kind]:.2f}x "
                     "(whole commands), medians")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000, help="files of each format")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--format", default="png", help="png, jpeg or both: png,jpeg")
    parser.add_argument("--repeats", type=int, default=5, help="first-epoch pairs (ours, torchvision)")
    parser.add_argument("--train-repeats", type=int, default=3, help="training runs of each kind")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--torchvision", metavar="PYTHON", help="an interpreter with torch and torchvision")
    args = parser.parse_args()
    formats = args.format.split(",")
    if set(formats) - {"png", "jpeg"}:
        parser.error(f"--format: png, jpeg or png,jpeg; received {args.format}")
    results = []
    for fmt in formats:
        with tempfile.TemporaryDirectory() as tmp:
            results.append(measure(Path(tmp), fmt, args, torch_python(args.torchvision)))
    print(json.dumps({"cores": len(os.sched_getaffinity(0)), "load_average": os.getloadavg(), "results": results},
                     indent=2))
    print("\n".join(said(r) for r in results), file=sys.stderr)


if __name__ == "__main__":
    main()
