"""`magmadnn bench` (the paper's MLP benchmark) at a tiny size: it runs anywhere, prints one record
per depth with our time, the GEMM floor and the time per added layer; bad depths are exit 2."""

from __future__ import annotations

import json

from conftest import run_cli


def test_bench_json_records_per_depth(capsys):
    code, out, err = run_cli(capsys, "bench", "--samples", "250", "--epochs", "1", "--layers", "1,3", "--json",
                             "--device", "cpu")
    assert code == 0, err
    records = json.loads(out)
    assert [r["layers"] for r in records] == [1, 3]
    for r in records:
        assert r["seconds"] > 0 and r["floor_seconds"] > 0 and r["device"] == "cpu" and r["samples"] == 250
    assert records[0]["delta_per_layer_s"] is None
    assert records[1]["delta_per_layer_s"] == (records[1]["seconds"] - records[0]["seconds"]) / 2


def test_bench_table_and_bad_depths(capsys):
    code, out, err = run_cli(capsys, "bench", "--samples", "120", "--epochs", "1", "--layers", "2", "--device", "cpu")
    assert code == 0, err
    assert "ours/floor" in out and "120 rows x 1 epochs" in out
    code, _, err = run_cli(capsys, "bench", "--layers", "1,x")
    assert code == 2 and "--layers: expected comma-separated whole numbers" in err
