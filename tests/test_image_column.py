"""Image paths in a table column (issue 46 item 1): `data.columns.photo: image` decodes each row's
image (relative to the table's folder) as a folder's images are decoded; train and evaluate from it;
a missing, blank or unreadable image named with its row and file; other feature columns refused."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.config.schema import DataConfig
from magmadnn_cli.data.readers import ReadSpec, read_table
from magmadnn_cli.errors import DataError

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(461)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def table(tmp_path, rows=12, extra=""):
    """tmp_path/data/labels.csv naming images/<i>.png (bright for 'hi', dark for 'lo'); the pixels."""
    (tmp_path / "data" / "images").mkdir(parents=True, exist_ok=True)
    lines, pixels = [f"photo,label{extra and ',' + extra}"], []
    for i in range(rows):
        label = "hi" if i % 2 else "lo"
        p = rng.integers(128 if label == "hi" else 0, 256 if label == "hi" else 128, size=(6, 5), dtype=np.uint8)
        Image.fromarray(p).save(tmp_path / "data" / "images" / f"{i}.png")
        pixels.append(p)
        lines.append(f"images/{i}.png,{label}" + (f",{i}" if extra else ""))
    (tmp_path / "data" / "labels.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "data" / "labels.csv", np.stack(pixels)


def spec(**data):
    return ReadSpec.of(DataConfig(train="x", target="label", columns={"photo": "image"}, **data))


def test_the_column_is_decoded_relative_to_the_table(tmp_path):
    csv, pixels = table(tmp_path)
    t = read_table(csv, spec())
    assert t.x.shape == (12, 1, 6, 5)
    np.testing.assert_array_equal(t.x[:, 0], pixels.astype(np.float32))
    assert t.y.tolist() == ["lo", "hi"] * 6 and t.settled["image"].size == [6, 5]


def test_image_settings_apply(tmp_path):
    csv, _ = table(tmp_path)
    t = read_table(csv, spec(image={"size": [3, 3], "color": "rgb"}))
    assert t.x.shape == (12, 3, 3, 3)


@pytest.mark.parametrize("damage, said", [("missing", "No such file"), ("corrupt", "cannot identify"),
                                          ("blank", "has no image path")])
def test_a_bad_image_named_with_row_and_file(tmp_path, damage, said):
    csv, _ = table(tmp_path)
    if damage == "missing":
        (tmp_path / "data" / "images" / "4.png").unlink()
    elif damage == "corrupt":
        (tmp_path / "data" / "images" / "4.png").write_bytes(b"no png")
    else:
        csv.write_text(csv.read_text().replace("images/4.png", ""))
    with pytest.raises(DataError, match=f"data row 5.*{said}") as caught:
        read_table(csv, spec())
    assert damage == "blank" or "images/4.png" in str(caught.value)


def test_other_feature_columns_refused_with_the_fix(tmp_path):
    csv, _ = table(tmp_path, extra="size")
    with pytest.raises(DataError, match=r"'size' cannot go beside it: list data.features: \[photo\]"):
        read_table(csv, spec())
    assert read_table(csv, spec(features=["photo"])).x.shape == (12, 1, 6, 5)


CONFIG = """
name: column
seed: 0
data: {{train: {train}, target: label, columns: {{photo: image}}, validation_split: 0.25}}
model:
  layers:
    - {{type: flatten}}
    - {{type: dense, units: 2, activation: softmax}}
loss: cross_entropy
optimizer: {{type: adam, learning_rate: 0.05}}
training: {{epochs: 20, batch_size: 4}}
"""


def test_train_and_evaluate_from_an_image_column(tmp_path, capsys):
    csv, _ = table(tmp_path, rows=40)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(train=csv))
    code, out, err = run_cli(capsys, "train", cfg, "--out", tmp_path / "run", "--quiet")
    assert code == 0, err
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run" / "model.npz", csv)
    assert code == 0, err
    assert "accuracy" in out
    code, out, err = run_cli(capsys, "predict", tmp_path / "run" / "model.npz", csv, "-o", tmp_path / "p.csv")
    assert code == 0, err
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert len(lines) == 41
