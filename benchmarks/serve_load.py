"""`magmadnn serve` under load, on loopback only: 16 concurrent clients sending single-row requests
(requests per second, p50 and p99 latency), and 256-row requests in each body form (JSON records,
dataframe_split, dataframe_records, CSV: rows per second) against `predict`'s in-process rate on the
same rows (one BLAS thread, as the server), measured in turn (--rounds times: predict, then each
form; medians, as the machine's load swings); for digits_mlp (64 number columns) and heart_raw
(categories, missing cells). Bounded: each phase stops after --requests requests or --seconds, and the server runs on 127.0.0.1 with a free
port. Models are trained first (a few epochs) into a temp folder. Run as one process:

    python benchmarks/serve_load.py [--clients 16] [--requests 4000] [--seconds 20] [--rows 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")  # predict in-process as the server runs
import numpy as np  # (after: OpenBLAS reads its threads as it loads)

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ)
HEART = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak", "slope", "ca", "thal"]


def rows_of(name: str) -> tuple[list[str], list[list[str]]]:
    """The model's feature columns and its training file's rows (target left out), as text."""
    if name == "heart_raw":
        lines = (ROOT / "datasets" / "processed.cleveland.data").read_text().splitlines()
        return HEART, [line.split(",")[:-1] for line in lines]
    with gzip.open(ROOT / "datasets" / "digits.csv.gz", "rt") as f:
        table = list(csv.reader(f))
    target = table[0].index("label")
    return [c for i, c in enumerate(table[0]) if i != target], [[c for i, c in enumerate(r) if i != target]
                                                                for r in table[1:]]


def record(names: list[str], row: list[str]) -> dict:
    return {n: (None if c == "?" else float(c)) for n, c in zip(names, row)}


def start(model: Path) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, "-m", "magmadnn_cli", "serve", str(model), "--port", "0"],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=ENV)
    for line in process.stderr:
        if line.startswith("serving "):
            port = int(line.split("http://127.0.0.1:", 1)[1].split(" ", 1)[0])
            threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
            break
    else:
        raise SystemExit(f"the server did not start (exit {process.wait()})")
    deadline = time.monotonic() + 60
    while post(port, "GET", "/ready", None)[0] != 200:
        if time.monotonic() > deadline:
            raise SystemExit("the server did not become ready in 60 s")
        time.sleep(0.05)
    return process, port


LOCAL = threading.local()


def post(port: int, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
    """One request on this thread's kept-alive connection (reopened if the server closed it); a body
    starting with `[` or `{` is JSON, any other CSV."""
    kind = "application/json" if body is None or body[:1] in (b"[", b"{") else "text/csv"
    for attempt in (0, 1):
        connection = getattr(LOCAL, "connection", None)
        if connection is None or getattr(LOCAL, "port", None) != port:
            LOCAL.connection = connection = HTTPConnection("127.0.0.1", port, timeout=60)
            LOCAL.port = port
        try:
            connection.request(method, path, body=body, headers={"Content-Type": kind})
            response = connection.getresponse()
            return response.status, response.read()
        except (ConnectionError, OSError):
            LOCAL.connection = None
            if attempt:
                raise
    raise AssertionError("unreachable")


def load(port: int, bodies: list[bytes], clients: int, requests: int, seconds: float) -> dict:
    """`requests` requests (at most `seconds` of them) from `clients` threads; latencies in ms."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds
    failed = [0]

    def one(i: int) -> None:
        if time.monotonic() > stop:
            return
        begin = time.perf_counter()
        status, _ = post(port, "POST", "/predict", bodies[i % len(bodies)])
        latencies.append((time.perf_counter() - begin) * 1000)
        failed[0] += status != 200

    begin = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - begin
    ms = np.array(latencies)
    return {"requests": len(ms), "failed": failed[0], "per_s": len(ms) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99))}


def in_process_rate(model: Path, data: Path, folder: Path) -> float:
    """`predict`'s rows per second in-process on the rows of `data` (a CSV file, model loaded each call)."""
    from magmadnn_cli.commands.predict import predict
    begin = time.perf_counter()
    count = predict(model, data, folder / "out.csv", overwrite=True)
    return count / (time.perf_counter() - begin)


FORMATS = ("records", "split", "df_records", "csv")  # the body forms /predict takes, as the table names them


def bodies(names: list[str], rows: list[list[str]], form: str) -> bytes:
    """The rows as one request body of this form: JSON records, {"dataframe_split": ...},
    {"dataframe_records": ...} or CSV text (the form predict reads)."""
    if form == "csv":
        return "\n".join([",".join(names)] + [",".join(r) for r in rows]).encode()
    body = [record(names, r) for r in rows]
    if form == "split":
        return json.dumps({"dataframe_split": {"columns": names, "data": [list(r.values()) for r in body]}}).encode()
    return json.dumps({"dataframe_records": body} if form == "df_records" else body).encode()


def bench(name: str, model: Path, args: argparse.Namespace, folder: Path) -> dict:
    """Single-row load, then --rounds rounds of predict's in-process rate and each body form's
    256-row load in turn (ABAB: the machine's load swings alike for both); medians."""
    names, rows = rows_of(name)
    singles = [json.dumps([record(names, r)]).encode() for r in rows]
    cycled = rows * (args.rows // len(rows) + 2)
    chunks = {form: [bodies(names, cycled[i:i + args.rows], form) for i in range(0, len(rows), args.rows)]
              for form in FORMATS}
    many = (rows * (20000 // len(rows) + 1))[:20000]
    data = folder / "rows.csv"
    data.write_text("\n".join([",".join(names)] + [",".join(r) for r in many]) + "\n")
    in_process_rate(model, data, folder)  # warm: imports, the file cached
    process, port = start(model)
    predicted, served = [], {form: [] for form in FORMATS}
    failed = 0
    try:
        load(port, singles, args.clients, 200, args.seconds)  # warm the connections
        single = load(port, singles, args.clients, args.requests, args.seconds)
        for _ in range(args.rounds):
            predicted.append(in_process_rate(model, data, folder))
            for form in FORMATS:
                got = load(port, chunks[form], args.clients, max(20, args.requests // 20), args.seconds)
                served[form].append(got["per_s"] * args.rows)
                failed += got["failed"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return {"model": name, "single": single, "rows_per_s": {f: float(np.median(v)) for f, v in served.items()},
            "failed": single["failed"] + failed, "predict_rows_per_s": float(np.median(predicted)),
            "predict_runs": predicted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="predict then each body form, this many times")
    args = parser.parse_args()
    print(f"load average (1, 5, 15 min) at the start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        results = []
        for name, epochs in (("digits_mlp", 5), ("heart_raw", 10)):
            subprocess.run([sys.executable, "-m", "magmadnn_cli", "train", str(ROOT / "configs" / f"{name}.yaml"),
                            "--out", str(folder / name), "-q", "--set", f"training.epochs={epochs}"], env=ENV,
                           check=True, capture_output=True)
            results.append(bench(name, folder / name / "model.npz", args, folder))
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'model':<11} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'failed':>6} {'predict rows/s':>15}   "
          + " ".join(f"{f:>10}" for f in FORMATS) + f"   ({args.rows}-row requests: rows/s, x predict)")
    for r in results:
        s, base = r["single"], r["predict_rows_per_s"]
        print(f"{r['model']:<11} {s['per_s']:>7.0f} {s['p50_ms']:>7.1f} {s['p99_ms']:>7.1f} {r['failed']:>6} "
              f"{base:>15.0f}   " + " ".join(f"{r['rows_per_s'][f]:>10.0f}" for f in FORMATS))
        print(f"{'':<11} {'':>7} {'':>7} {'':>7} {'':>6} {'':>15}   "
              + " ".join(f"{r['rows_per_s'][f] / base:>9.2f}x" for f in FORMATS))
        print(f"{'':<11} predict's runs (rows/s): {', '.join(f'{v:.0f}' for v in r['predict_runs'])}")


if __name__ == "__main__":
    main()
