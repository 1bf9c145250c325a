"""Shared by the serve tests: small trained models (heart_raw: categories, missing cells, data.names;
digits_mlp: 64 number columns), their rows as CSV and records, and `predict --proba`'s answer."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from conftest import ROOT, run_train

HEART_NAMES = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak", "slope", "ca",
               "thal"]


def train_models(folder: Path, only: tuple[str, ...] = ("heart", "digits")) -> dict[str, Path]:
    """heart_raw (3 epochs) and digits_mlp (1 epoch), those named in `only`, trained into `folder`;
    their model files."""
    models = {}
    for name, config, epochs in (("heart", "heart_raw.yaml", 3), ("digits", "digits_mlp.yaml", 1)):
        if name not in only:
            continue
        result = run_train(folder / name, [f"training.epochs={epochs}"], config=ROOT / "configs" / config)
        assert result.returncode == 0, result.stderr
        models[name] = folder / name / "model.npz"
    return models


def loaded_models(folder: Path) -> dict[str, tuple]:
    """Each model `train_models` trains, loaded once: (Predictor, its read spec for request bodies)."""
    from magmadnn_cli.inference import Predictor, read_spec
    found = {}
    for name, path in train_models(folder).items():
        model = Predictor(path, "cpu")
        with model.using():
            found[name] = model, read_spec(model.path, model.saved, False)
    return found


def heart_rows(count: int = 40, start: int = 80) -> list[list[str]]:
    """Rows of the raw Cleveland file (their `?` cells missing), without the target."""
    lines = (ROOT / "datasets" / "processed.cleveland.data").read_text().splitlines()[start:start + count]
    return [line.split(",")[:-1] for line in lines]


def digits_rows(count: int = 40) -> tuple[list[str], list[list[str]]]:
    import gzip
    with gzip.open(ROOT / "datasets" / "digits.csv.gz", "rt") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [row for _, row in zip(range(count), reader)]
    target = header.index("label")
    return [h for i, h in enumerate(header) if i != target], [[c for i, c in enumerate(r) if i != target] for r in rows]


def csv_text(names: list[str], rows: list[list[str]], header: bool = True) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(names)
    writer.writerows(rows)
    return out.getvalue()


def json_value(cell: str):
    """A CSV cell as a JSON client sends it: a number, null for `?`, else the text."""
    if cell.strip() in ("", "?"):
        return None
    try:
        value = float(cell)
    except ValueError:
        return cell
    return int(value) if value.is_integer() and math.isfinite(value) and "." not in cell else value


def records(names: list[str], rows: list[list[str]]) -> list[dict]:
    return [{n: json_value(c) for n, c in zip(names, row)} for row in rows]


def predicted(capsys, model: Path, folder: Path, names: list[str], rows: list[list[str]],
              proba: bool = True) -> list[list[str]]:
    """`magmadnn predict MODEL rows.csv [--proba]`'s rows (header dropped), as text."""
    from conftest import run_cli
    data = folder / "rows.csv"
    data.write_text(csv_text(names, rows))
    code, out, err = run_cli(capsys, "predict", model, data, *(["--proba"] if proba else []))
    assert code == 0, err
    return [row for row in csv.reader(io.StringIO(out))][1:]
