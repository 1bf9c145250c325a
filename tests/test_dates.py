"""Date columns (issue 28): ISO dates and date-times (or data.date_format) are inferred or declared,
expanded into year, month, day, weekday, day of year and hour, stored with the model and applied by
evaluate, predict and export. The features are checked against Python's datetime, and a model learns
a weekday rule it could not learn from the dates' text."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.data import dates

CONFIG = """\
name: days
seed: 0
device: cpu
data: {{train: {train}, target: load, test_split: 0.2{extra}}}
model: {{layers: [{{type: dense, units: 16, activation: relu}}, {{type: dense, units: 2, activation: softmax}}]}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.02}}
training: {{epochs: 40, batch_size: 16, checkpoint: false}}
"""


def _moments(n: int, seed: int = 0) -> list[datetime]:
    rng = np.random.default_rng(seed)
    start = datetime(2023, 1, 1)
    return [start + timedelta(days=int(d), hours=int(h), minutes=int(m))
            for d, h, m in zip(rng.integers(0, 730, n), rng.integers(0, 24, n), rng.integers(0, 60, n))]


def _busy(moment: datetime) -> str:
    return "busy" if moment.weekday() >= 5 else "quiet"


def _write(folder, moments: list[datetime], spell=lambda m: m.isoformat(sep=" ")) -> None:
    rng = np.random.default_rng(1)
    lines = ["when,noise,load"] + [f"{spell(m)},{rng.normal():.3f},{_busy(m)}" for m in moments]
    (folder / "days.csv").write_text("\n".join(lines) + "\n")


def test_the_features_agree_with_python_datetime():
    rng = np.random.default_rng(0)
    seconds = np.concatenate([rng.integers(-2_208_988_800, 4_102_444_800, 5000),  # 1900 .. 2100
                              [951_782_400, 951_868_800, 4_107_542_400, -2_203_891_200]])  # Feb 29 2000, 2100-03-01
    got = dates.features(seconds.astype(np.float64), True, np.dtype(np.float64))
    for row, s in zip(got, seconds.tolist()):
        moment = datetime(1970, 1, 1) + timedelta(seconds=s)
        expected = [moment.year, moment.month, moment.day, moment.weekday(), moment.timetuple().tm_yday,
                    moment.hour + moment.minute / 60 + moment.second / 3600]
        np.testing.assert_allclose(row, expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("text, expected", [
    ("2024-03-15", datetime(2024, 3, 15)), ("2024-03-15T14:30", datetime(2024, 3, 15, 14, 30)),
    ("2024-03-15 14:30:00.5", datetime(2024, 3, 15, 14, 30, 0, 500000)),
    ("2024-03-15T14:30:00Z", datetime(2024, 3, 15, 14, 30)), ("2024-03-15T14:30:00+01:00", datetime(2024, 3, 15, 14, 30)),
    ("2024-13-01", None), ("15/03/2024", None), ("2024-03-15x", None), ("20240315", None), ("", None),
])
def test_iso_dates_parse_and_other_text_does_not(text, expected):
    assert dates.parse(text) == expected


def test_a_date_column_is_inferred_and_a_weekday_rule_is_learned(capsys, tmp_path):
    _write(tmp_path, _moments(500))
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="days.csv", extra=""))
    code, out, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 0, err
    log = out + err
    assert "when (date: when.year, when.month, when.day, when.weekday, when.yearday, when.hour)" in log, log
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["test"]["accuracy"] >= 0.95
    new = [datetime(2024, 11, 30, 9), datetime(2024, 12, 2, 9), datetime(2024, 12, 7)]  # Sat, Mon, Sat
    (tmp_path / "new.csv").write_text("when,noise\n" + "".join(f"{m.isoformat()},0\n" for m in new))
    code, out, err = run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "new.csv"))
    assert code == 0, err
    assert out.split() == ["prediction", "busy", "quiet", "busy"]


def test_a_declared_format_and_a_cell_that_is_no_date(capsys, tmp_path):
    _write(tmp_path, _moments(300), spell=lambda m: m.strftime("%d/%m/%Y"))
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="days.csv", extra=", date_format: '%d/%m/%Y'"))
    code, out, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert "when.yearday)" in out + err  # no times in the cells: no hour feature
    (tmp_path / "new.csv").write_text("when,noise\n28/11/2026,0\n2026-11-28,0\n")
    code, _, err = run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "new.csv"))
    assert code == 2 and "column 'when', data row 2: '2026-11-28' is not a date; expected a date written " \
        "'%d/%m/%Y'; the model reads this column as dates so (as it was trained): fix the cell" in err, err



def test_typed_date_columns_of_parquet_read_as_dates(capsys, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    moments = _moments(400)
    _write(tmp_path, moments)
    table = pa.table({"when": pa.array(moments, pa.timestamp("us")), "day": pa.array([m.date() for m in moments]),
                      "load": [_busy(m) for m in moments]})
    pq.write_table(table, tmp_path / "days.parquet")
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="days.parquet", extra=""))
    code, out, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert "when (date:" in out + err and "day (date: day.year, day.month, day.day, day.weekday, day.yearday)" in out + err


def test_export_computes_the_date_features_in_the_graph(capsys, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    moments = _moments(300)
    _write(tmp_path, moments)
    lines = (tmp_path / "days.csv").read_text().splitlines()
    lines[5] = "," + lines[5].split(",", 1)[1]  # a missing date: the training median fills it
    (tmp_path / "days.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.yaml").write_text(CONFIG.format(train="days.csv", extra=", missing_indicator: true"))
    assert run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"), "-q")[0] == 0
    assert run_cli(capsys, "export", str(tmp_path / "run"), "-o", str(tmp_path / "m.onnx"))[0] == 0
    code, out, err = run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "days.csv"), "--proba")
    assert code == 0, err
    printed = list(csv.reader(io.StringIO(out)))[1:]
    rows = list(csv.reader(lines[1:]))
    moments = np.array([r[0] for r in rows], "datetime64[s]")  # README's recipe, numpy's parser (not ours)
    when = np.where(np.isnat(moments), np.nan, moments.astype(np.float64))[:, None]
    noise = np.array([[float(r[1])] for r in rows], np.float32)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    assert [(i.name, i.type) for i in session.get_inputs()] == [("when", "tensor(double)"), ("noise", "tensor(float)")]
    described = session.get_modelmeta().custom_metadata_map["inputs"]
    assert "when: a date: float64 seconds since 1970-01-01" in described and "noise: float32" in described
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"when": when, "noise": noise})))
    np.testing.assert_allclose(outputs["probabilities"], [[float(v) for v in r[1:]] for r in printed], atol=1e-5)
    assert list(outputs["label"]) == [r[0] for r in printed]
