"""Messy tables: text categories, booleans and missing cells, typed (inferred or declared), fitted on
training rows only, stored in the model and applied by evaluate and predict; regression targets
standardized and returned in the data's units."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from conftest import run_cli
from magmadnn_cli.config.data import DataConfig
from magmadnn_cli.data.cells import RawColumns
from magmadnn_cli.data.fitting import fit
from magmadnn_cli.data.prepare import prepare
from magmadnn_cli.errors import DataError

MESSY = """\
size,color,member,weight,label
1.0,green,yes,10,small
NA,red,no,,small
3.0,green,,30,big
4.0,?,yes,40,big
5.0,blue,no,n/a,big
"""


def _cfg(tmp_path, text=MESSY, **data):
    (tmp_path / "m.csv").write_text(text)
    return DataConfig(train=tmp_path / "m.csv", target="label", **({"validation_split": 0.0} | data))


def _columns(prepared):
    return {c.name: c for c in prepared.encoder.columns}


def test_types_are_inferred_and_missing_cells_filled_from_training_rows(tmp_path):
    data = prepare(_cfg(tmp_path), "classification", 0)
    cols = _columns(data)
    assert [cols[n].kind for n in ("size", "color", "member", "weight")] == ["number", "category", "boolean", "number"]
    assert cols["size"].fill == np.median([1, 3, 4, 5])          # NA: the median of the present cells
    assert cols["weight"].fill == np.median([10, 30, 40])        # blank and n/a both missing
    assert cols["color"].categories == ["(missing)", "blue", "green", "red"]  # '?' is missing: its own category
    assert cols["color"].fill == "(missing)"
    assert cols["member"].fill.lower() in ("true", "false", "yes", "no")  # as the cells write it (issue 44)
    # encoded width: size 1 + color 4 + member 1 + weight 1
    assert data.sample_shape == (7,)
    x = data.train.x
    assert np.isfinite(x).all()
    # rows in the data's order are recovered through the split permutation: find the row with size 2
    # (impossible: size NA was filled with the median 3.5) -> exactly two rows have size 3.5? no: one
    assert sum(np.isclose(data.normalizer.shift[0] + x[:, 0] * data.normalizer.spread[0], 3.5)) == 1
    assert any("columns read as categories" in n and "color (category, 3 values and blanks)" in n for n in data.notes)
    assert any("median: size (1), weight (2)" in n for n in data.notes)


def test_one_hot_columns_are_not_normalized(tmp_path):
    data = prepare(_cfg(tmp_path, normalize="standard"), "classification", 0)
    onehot = data.train.x[:, 1:5]  # color: (missing), blue, green, red
    assert set(np.unique(onehot)) <= {0.0, 1.0} and (onehot.sum(axis=1) == 1).all()
    assert abs(data.train.x[:, 0].mean()) < 1e-6                 # the number column is standardized


@pytest.mark.parametrize("strategy,expected", [("mean", (1 + 3 + 4 + 5) / 4), ("median", 3.5),
                                               ("most_frequent", 1.0), ("constant", -1.0)])
def test_missing_value_strategies(tmp_path, strategy, expected):
    spec = {"missing": strategy} | ({"fill_value": -1} if strategy == "constant" else {})
    data = prepare(_cfg(tmp_path, columns={"size": spec}), "classification", 0)
    assert _columns(data)["size"].fill == pytest.approx(expected)


def test_missing_indicator_adds_a_column_for_columns_with_missing_cells(tmp_path):
    data = prepare(_cfg(tmp_path, missing_indicator=True), "classification", 0)
    names = data.encoder.output_names()
    assert "size_missing" in names and "weight_missing" in names and "color_missing" in names
    column = names.index("weight_missing")
    assert data.train.x[:, column].sum() == 2                     # blank and n/a
    note = next(n for n in data.notes if "missing cells filled" in n)
    assert "0/1 columns added: size_missing, weight_missing" in note and "adds" not in note, note
    quiet = next(n for n in prepare(_cfg(tmp_path), "classification", 0).notes if "missing cells filled" in n)
    assert "data.missing_indicator adds 0/1 columns" in quiet


def test_missing_values_error_names_the_column_and_row(tmp_path):
    with pytest.raises(DataError, match=r"column 'size', data row 2: a missing cell"):
        prepare(_cfg(tmp_path, missing_values="error"), "classification", 0)


def test_declared_types_override_inference(tmp_path):
    data = prepare(_cfg(tmp_path, columns={"weight": "category", "member": "ignore"}), "classification", 0)
    cols = _columns(data)
    assert "member" not in cols and cols["weight"].kind == "category"
    assert cols["weight"].categories == ["(missing)", "10", "30", "40"]  # numbers spelled shortest
    with pytest.raises(DataError, match=r"column 'color', data row 1: 'green' is not a number"):
        prepare(_cfg(tmp_path, columns={"color": "number"}), "classification", 0)


def test_fit_uses_training_rows_only():
    raw = RawColumns(np.array([[1.0], [np.nan], [3.0], [100.0]], np.float32), {})
    cfg = DataConfig(train="x.csv", target="y")
    encoder, _ = fit(raw.rows(np.array([0, 1, 2])), ["a"], cfg, "x.csv")
    assert encoder.columns[0].fill == 2.0                          # not the median with the 100 row


def _run(capsys, tmp_path, csv_text, extra_data="", loss="cross_entropy", head="3, activation: softmax", epochs=60):
    (tmp_path / "train.csv").write_text(csv_text)
    (tmp_path / "c.yaml").write_text(f"""\
name: messy
seed: 0
device: cpu
data: {{train: train.csv, target: label, validation_split: 0.0, normalize: standard{extra_data}}}
model: {{layers: [{{type: dense, units: 16, activation: relu}}, {{type: dense, units: {head}}}]}}
loss: {loss}
optimizer: {{type: adam, learning_rate: 0.02}}
training: {{epochs: {epochs}, batch_size: 16, checkpoint: false}}
""")
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    return tmp_path / "run" / "model.npz"


def test_categories_that_differ_only_in_case_are_named_in_training_and_in_predict(capsys, tmp_path):
    """'Paris' and 'PARIS' are two one-hot inputs, and 'paris' in a new file matches neither: training
    names the twins; predict names the unseen values, and the known spelling each one differs from in case."""
    rows = [f"{c},{s:.2f},{'ab'[i % 2]}" for i, (c, s) in
            enumerate(zip(["Paris", "PARIS", "Lyon", "lyon", "Nice"] * 12, np.linspace(0, 1, 60)))]
    model = _run(capsys, tmp_path, "city,size,label\n" + "\n".join(rows) + "\n", head="2, activation: softmax", epochs=2)
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "again")
    said = " ".join((out + err).split())
    assert code == 0 and "column 'city': categories that differ only in case ('Lyon', 'lyon'; 'PARIS', 'Paris') are " \
        "separate inputs" in said and "spell each one way in the file" in said, said
    lines = ["city,size"] + ["paris,0.5"] * 3 + ["Marseille,0.2", "Nice,0.1"]
    (tmp_path / "new.csv").write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "new.csv")
    said = " ".join(err.split())
    assert code == 0 and "encoded as all zeros: city (4: 'paris' ('PARIS', 'Paris' in training) x3, 'Marseille' x1)" in said, said


def test_unseen_values_are_counted_in_bounded_memory():
    from collections import Counter
    from magmadnn_cli.data.classes import OTHERS, UNSEEN_KEPT, add_unseen, unseen_categories
    tally = {}
    for chunk in range(3):
        add_unseen(tally, {"id": Counter({f"C-{chunk}-{i}": 1 for i in range(UNSEEN_KEPT)}), "x": Counter({"q": 2})})
    assert len(tally["id"]) <= UNSEEN_KEPT and sum(tally["id"].values()) == 3 * UNSEEN_KEPT and OTHERS in tally["id"]
    said = unseen_categories(tally, {})
    assert said.startswith(f"id ({3 * UNSEEN_KEPT}: ") and "x (6: 'q' x6)" in said and "\\x00" not in said, said


def _color_data(n=90, seed=0):
    """The label is the color (a category); size is noise with missing cells."""
    rng = np.random.default_rng(seed)
    colors = np.array(["red", "green", "blue"])[np.arange(n) % 3]
    sizes = [("NA" if i % 7 == 0 else f"{rng.normal():.3f}") for i in range(n)]
    labels = {"red": "warm", "green": "plant", "blue": "cold"}
    return "size,color,label\n" + "".join(f"{s},{c},{labels[c]}\n" for s, c in zip(sizes, colors))


def test_category_features_train_and_predict_from_the_model_file(capsys, tmp_path):
    model = _run(capsys, tmp_path, _color_data())
    (tmp_path / "new.csv").write_text("id,color,size,extra\n7,blue,,x\n8,red,0.5,y\n9,purple,1,z\n")
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "new.csv", "--keep", "id")
    assert code == 0, err
    for keep, said in ((["id", "id"], "--keep id: given twice"),
                       (["prediction"], "--keep prediction: the output has a column of that name (prediction)")):
        (tmp_path / "kept.csv").write_text("id,color,size,prediction\n7,blue,1,old\n")
        refused = run_cli(capsys, "predict", model, tmp_path / "kept.csv", *[a for k in keep for a in ("--keep", k)],
                          "-o", tmp_path / "k.parquet")
        assert refused[0] == 2 and said in refused[2] and not (tmp_path / "k.parquet").exists(), refused
    rows = [line.split(",") for line in out.splitlines()]
    assert rows[0] == ["id", "prediction"] and rows[1] == ["7", "cold"] and rows[2] == ["8", "warm"]
    assert "ignoring 1 column(s) the model does not use: extra" in err
    assert "categories not seen in training, encoded as all zeros: color (1: 'purple' x1)" in " ".join(err.split())
    assert re.search(r"missing cells filled as in training: size \(1: median -?[0-9.]+\)", " ".join(err.split())), err
    (tmp_path / "new.csv").write_text("id,color,size,extra\n7,blue,0,x\n8,red,0.5,y\n9,purple,1,z\n")
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "new.csv", "--strict", "-o", tmp_path / "p.csv")
    assert code == 2 and "column 'color', data row 3: category 'purple' was not in the training data (known: 'blue', " in err
    assert "--strict refuses them (without it they are encoded as all zeros" in " ".join(err.split()), err
    assert "unseen_categories" not in err and not (tmp_path / "p.csv").exists()  # --strict refused it, not the config
    code, out, err = run_cli(capsys, "evaluate", model, tmp_path / "train.csv", "--json")
    assert code == 0 and json.loads(out)["accuracy"] == 1.0
    said = " ".join(err.split())
    assert re.search(r"missing cells filled as in training: size \(13: median -?[0-9.]+\) \(--strict refuses", said)


def test_predict_says_which_cells_it_filled_and_strict_refuses_them(capsys, tmp_path):
    """A newcomer's row of blank cells was predicted (327984.8) without a word, and --strict let it
    through; training says what it filled, so predict does too."""
    model = _run(capsys, tmp_path, _color_data())
    (tmp_path / "new.csv").write_text("color,size\nblue,\nred,0.5\n?,NA\ngreen,1\n")
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "new.csv")
    said = " ".join(err.split())
    assert code == 0 and len(out.splitlines()) == 5, err
    assert re.search(r"new.csv: missing cells filled as in training: size \(2: median -?[0-9.]+\), color \(1: most "
                     r"frequent value '(blue|green|red)'\) \(--strict refuses them\)", said), said
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "new.csv", "--strict")
    said = " ".join(err.split())
    assert code == 2 and out == "" and "new.csv: column 'size', data row 1: a missing cell" in said, said
    assert "--strict refuses" in said and "without --strict it is filled as in training: median" in said, said
    code, _, err = run_cli(capsys, "evaluate", model, tmp_path / "train.csv", "--strict")
    assert code == 2 and "column 'size', data row 1: a missing cell" in " ".join(err.split()), err
    complete = "color,size,label\n" + "".join(f"{c},{i * 0.1:.1f},{c}x\n" for i, c in enumerate(["red", "blue"] * 20))
    (tmp_path / "complete").mkdir()
    model = _run(capsys, tmp_path / "complete", complete, extra_data=", missing_values: error", head="2, activation: softmax", epochs=2)
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "new.csv")  # no --strict: the model's own rule
    said = " ".join(err.split())
    assert code == 2 and "column 'size', data row 1: a missing cell; the model was trained with missing cells " \
        "refused (data.missing_values: error)" in said and "--strict" not in said, said


def test_regression_targets_are_standardized_and_predicted_in_data_units(capsys, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2))
    price = 250_000 + 40_000 * x[:, 0] - 25_000 * x[:, 1]         # house prices: large targets
    text = "a,b,label\n" + "".join(f"{a:.4f},{b:.4f},{p:.2f}\n" for (a, b), p in zip(x, price))
    model = _run(capsys, tmp_path, text, loss="mse", head="1", epochs=80)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["train"]["r2"] > 0.99                           # R2 -8 before scaling
    with np.load(model, allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
    assert meta["target_scale"]["shift"][0] == pytest.approx(price.mean(), rel=1e-6)
    code, out, err = run_cli(capsys, "predict", model, tmp_path / "train.csv")
    predicted = np.array([float(v) for v in out.splitlines()[1:]])
    assert np.abs(predicted - price).mean() < 0.05 * price.std()   # in dollars, not standard units
    assert all(len(v.split(".")[-1]) <= 7 for v in out.splitlines()[1:])  # no 222.18209838867188
    code, _, err = run_cli(capsys, "predict", model, tmp_path / "train.csv", "--proba")
    assert code == 2 and "--proba gives class probabilities; this is a regression model" in err
    code, out, _ = run_cli(capsys, "evaluate", model, tmp_path / "train.csv", "--json")
    report = json.loads(out)
    mse = np.mean((predicted - price) ** 2)  # the 7 digits predict writes: close to the model's own
    assert report["rmse"] == pytest.approx(np.sqrt(report["mse"]), rel=1e-12)
    assert report["mse"] == pytest.approx(mse, rel=1e-3) and report["mae"] <= report["rmse"]
    code, out, _ = run_cli(capsys, "evaluate", model, tmp_path / "train.csv")
    assert f"{report['mse']:,.0f}" in out and f"{report['rmse']:.4f}" in out and f"{report['r2']:.4f}" in out, out
    assert "0.0000" not in out and f"{report['loss']:.3e}" in out  # a loss in standard units below 1e-3


@pytest.mark.parametrize("head, normalize, expected", [
    ("sigmoid", "", ["model.layers.1.activation: sigmoid outputs lie in [0, 1]", "of the training targets, "
                     "standardized (data.target_normalize: auto)", "your targets lie in [0, 1]: keep the sigmoid "
                     "with data.target_normalize: none"]),
    ("relu", "", ["relu outputs lie in [0, inf]", "make the output linear"]),
    ("tanh", ", target_normalize: standard", ["tanh outputs lie in [-1, 1]", "(data.target_normalize: standard)"]),
])
def test_a_bounded_regression_head_that_cannot_reach_the_targets_is_refused(capsys, tmp_path, head, normalize,
                                                                            expected):
    """A sigmoid output on standardized targets reaches only [mean, mean + 1 sd]: it trained to R2 0.31
    on the diabetes data (0.42 linear), silently. Refused with the share out of reach and the fix."""
    rng = np.random.default_rng(1)
    x = rng.random((120, 2))
    text = "a,b,label\n" + "".join(f"{a:.4f},{b:.4f},{0.1 + 0.8 * a * b:.4f}\n" for a, b in x)  # targets in [0, 1]
    (tmp_path / "train.csv").write_text(text)
    (tmp_path / "c.yaml").write_text(
        f"name: bounded\nseed: 0\ndata: {{train: train.csv, target: label, validation_split: 0.0{normalize}}}\n"
        f"model: {{layers: [{{type: dense, units: 8, activation: relu}}, {{type: dense, units: 1, activation: {head}}}]}}\n"
        "loss: mse\noptimizer: {type: adam, learning_rate: 0.02}\ntraining: {epochs: 2, checkpoint: false}\n")
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    flat = " ".join(err.split())
    assert code == 2 and "c.yaml:4:" in flat and "Traceback" not in flat and not (tmp_path / "run").exists(), err
    for part in expected:
        assert part in flat, flat
    if head == "sigmoid":  # the fix it gives works: targets in [0, 1] as they are
        code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q",
                               "--set", "data.target_normalize=none")
        assert code == 0, err
        code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "bn", "-q",
                               "--set", "model.layers=[{type: dense, units: 8, activation: relu}, "
                               "{type: dense, units: 1, activation: sigmoid}, {type: batchnorm}]")
        assert code == 0, err  # a batchnorm after the head scales and shifts it: any target is in reach
        exact = "a,b,label\n" + "".join(f"{a:.4f},{b:.4f},{float(a > 0.5):.0f}\n" for a, b in x)  # targets 0 and 1
        (tmp_path / "train.csv").write_text(exact)
        code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "exact", "-q")
        assert code == 2 and "your targets lie in [0, 1]: keep the sigmoid" in " ".join(err.split()), err


def test_target_normalize_none_keeps_raw_targets(tmp_path):
    text = "a,label\n" + "".join(f"{i},{1000 + 10 * i}\n" for i in range(20))
    (tmp_path / "m.csv").write_text(text)
    cfg = DataConfig(train=tmp_path / "m.csv", target="label", validation_split=0.0)
    assert abs(prepare(cfg, "regression", 0).train.y.mean()) < 1e-5
    raw = prepare(cfg.model_copy(update={"target_normalize": "none"}), "regression", 0)
    assert raw.train.y.mean() == pytest.approx(1095.0)


def test_headerless_file_with_names(capsys, tmp_path):
    rows = _color_data().splitlines()[1:]
    (tmp_path / "h.data").write_text("\n".join(rows) + "\n")
    (tmp_path / "c.yaml").write_text("""\
name: headerless
seed: 0
device: cpu
data: {train: h.data, names: [size, color, label], target: label, validation_split: 0.0}
model: {layers: [{type: dense, units: 3, activation: softmax}]}
loss: cross_entropy
optimizer: {type: adam, learning_rate: 0.05}
training: {epochs: 40, checkpoint: false}
""")
    code, _, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    model = tmp_path / "run" / "model.npz"
    code, out, err = run_cli(capsys, "evaluate", model, tmp_path / "h.data", "--json")
    assert code == 0 and json.loads(out)["rows"] == 90 and json.loads(out)["accuracy"] == 1.0
    (tmp_path / "with_header.csv").write_text(_color_data())      # a headed export of the same rows
    code, out, err = run_cli(capsys, "evaluate", model, tmp_path / "with_header.csv", "--json")
    assert code == 0 and json.loads(out)["rows"] == 90
    code, expected, err = run_cli(capsys, "predict", model, tmp_path / "h.data", "--proba")
    assert code == 0, err
    (tmp_path / "new.data").write_text("".join(r.rsplit(",", 1)[0] + "\n" for r in rows))  # new rows: no label
    (tmp_path / "new.csv").write_text("size,color\n" + (tmp_path / "new.data").read_text())
    for new in ("new.data", "new.csv"):  # data.names but the target, with or without their header
        code, out, err = run_cli(capsys, "predict", model, tmp_path / new, "--proba")
        assert code == 0 and out == expected, err
    code, _, err = run_cli(capsys, "evaluate", model, tmp_path / "new.data")
    assert code == 2 and "label" in err, err


def test_a_misspelt_column_in_data_columns_is_named_with_a_suggestion(tmp_path):
    with pytest.raises(DataError, match=r"data.columns names 'colour', which is not a column of the file; "
                                        r"did you mean 'color'\?"):
        prepare(_cfg(tmp_path, columns={"colour": "category"}), "classification", 0)


@pytest.mark.parametrize("entry,where", [("categry", "data.columns.city:"), ("{type: categry}", "data.columns.city.type:")])
def test_a_misspelt_column_type_is_one_problem_with_a_suggestion(capsys, tmp_path, entry, where):
    (tmp_path / "c.yaml").write_text(f"""\
name: t
data: {{train: m.csv, target: label, columns: {{city: {entry}}}}}
model: {{layers: [{{type: dense, units: 2, activation: softmax}}]}}
loss: cross_entropy
optimizer: sgd
""")
    code, _, err = run_cli(capsys, "validate", tmp_path / "c.yaml")
    assert code == 2 and "(1 problem)" in err and where in err and "did you mean 'category'?" in err
    assert "ColumnSpec" not in err and "function-after" not in err


@pytest.mark.parametrize("header, names, features", [
    ("size,color,label", ["size", "color", "label"], ["size", "color"]),      # names equal to the header
    ("color,size,label", ["size", "color", "label"], ["color", "size"]),      # the same names, another order
    ("size,size,label", ["size", "color", "label"], ["size", "color"]),       # a duplicate renamed by position
])
def test_data_names_never_train_a_header_row_as_data(tmp_path, header, names, features):
    """data.names on a file that has a header row: the header is not a data row. The same names in
    any order: the file's own order; names that overlap (a duplicate column renamed): by position."""
    body = _color_data().split("\n", 1)[1]
    if header.startswith("color"):
        body = "".join(f"{c},{s},{lab}\n" for s, c, lab in (line.split(",") for line in body.splitlines()))
    data = prepare(_cfg(tmp_path, header + "\n" + body, names=names), "classification", 0)
    assert len(data.train.x) == 90 and data.features == features
    assert sorted(data.classes) == ["cold", "plant", "warm"]
    assert _columns(data)["color"].kind == "category" and _columns(data)["size"].kind == "number"


@pytest.mark.parametrize("rows, names", [
    (["loss,3,5", "win,7,2"], ["outcome", "win", "loss"]),       # a value equal to a name, in another column
    (["1,0,2,a", "0,2,1,b"], ["0", "1", "2", "label"]),          # names that are numbers
    (["win,3,5", "loss,7,2"], ["win", "f1", "f2"]),              # a value equal to the name of its own column
])
def test_a_headerless_file_whose_first_row_holds_a_name_is_all_data(tmp_path, rows, names):
    """A headerless file's first row may hold a column's name as a value: it is data, not a header to
    refuse (nor one to drop)."""
    from magmadnn_cli.data.csv_reader import detect
    (tmp_path / "h.csv").write_text("\n".join(rows * 3) + "\n")
    fmt = detect(tmp_path / "h.csv", None, "utf-8", tuple(names))
    assert fmt.names == tuple(names) and not fmt.header


def test_data_names_against_the_first_row_take_time_linear_in_the_columns(tmp_path):
    from magmadnn_cli.data.csv_reader import detect
    n = 100_000
    header = [f"w{i}" for i in range(n)]
    header[0], header[-1] = header[-1], "extra"  # a header of the names but one, the first one misplaced
    (tmp_path / "wide.csv").write_text(",".join(header) + "\n" + ",".join(["1"] * n) + "\n")
    started = time.process_time()
    with pytest.raises(DataError, match=f"the header has 'w{n - 1}' in column 1"):
        detect(tmp_path / "wide.csv", None, "utf-8", tuple(f"w{i}" for i in range(n)))
    assert time.process_time() - started < 5.0  # linear: ~0.2 s; a scan of the names per field took 11 s at 40,000


def test_a_header_in_another_order_than_data_names_is_refused_not_read_by_position(capsys, tmp_path):
    """A model trained with data.names (a duplicate header renamed): a file whose header holds a name
    of data.names in another column was read by position (tenure as spend), silently. It is refused;
    a header of data.names' names in any order is read by name."""
    rng = np.random.default_rng(0)
    rows = [(int(s), int(t), "ab"[i % 2], "cd"[i % 3 % 2], "churn" if t < 30 else "stay")
            for i, (s, t) in enumerate(zip(rng.integers(1, 1000, 200), rng.integers(0, 80, 200)))]
    def write(name, header, order):
        body = "".join(",".join(str(r[j]) for j in order) + "\n" for r in rows)
        (tmp_path / name).write_text(header + "\n" + body)
    write("train.csv", "spend,tenure,note,note,label", [0, 1, 2, 3, 4])
    (tmp_path / "c.yaml").write_text(
        "name: dup\nseed: 0\ndata: {train: train.csv, target: label, names: [spend, tenure, note, note2, label]}\n"
        "model: {layers: [{type: dense, units: 8, activation: relu}, {type: dense, units: 2, activation: softmax}]}\n"
        "loss: cross_entropy\noptimizer: {type: adam, learning_rate: 0.05}\ntraining: {epochs: 3, checkpoint: false}\n")
    assert run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run", "-q")[0] == 0
    write("swapped.csv", "tenure,spend,note,note,label", [1, 0, 2, 3, 4])
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "swapped.csv")
    assert code == 2 and not out, err
    assert "swapped.csv:1:" in err and "'tenure' in column 1" in err and "data.names" in err, err
    assert "spend, tenure, note, note2, label" in err and "Traceback" not in err
    write("renamed.csv", "tenure,spend,note2,note,label", [1, 0, 3, 2, 4])  # every name: read by name
    code, by_name, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "renamed.csv", "--proba")
    assert code == 0, err
    assert run_cli(capsys, "predict", tmp_path / "run", tmp_path / "train.csv", "--proba")[1] == by_name
    (tmp_path / "other.csv").write_text("label,region,spend,tenure,note\n" + "churn,EU,1,2,a\n")
    code, _, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "other.csv")
    assert code == 2 and "'label' in column 1" in err, err


def _typo_csv(typo_row: int = 7, rows: int = 40) -> str:
    lines = ["width,code,label"]
    for i in range(1, rows + 1):
        width = "3..5" if i == typo_row else f"{2 + i * 0.037:.3f}"
        lines.append(f"{width},{'XY'[i % 2] if i % 3 == 0 else i % 4},{'ab'[i % 2]}")
    return "\n".join(lines) + "\n"


def test_a_number_column_with_a_stray_text_cell_is_refused_not_read_as_categories(tmp_path):
    """39 of 40 cells are numbers: the text one is a typo to fix, not 40 one-hot categories."""
    with pytest.raises(DataError, match=r"m\.csv: column 'width', data row 7: 1 of the column's 40 present cells in "
                                        r"the training rows are not numbers, while 39 are: '3\.\.5' \(1: data row 7\)") as caught:
        prepare(_cfg(tmp_path, _typo_csv()), "classification", 0)
    assert "data.columns.width: category" in str(caught.value)
    typed = prepare(_cfg(tmp_path, _typo_csv(), columns={"width": "category"}), "classification", 0)
    assert _columns(typed)["width"].kind == "category"
    codes = _columns(prepare(_cfg(tmp_path, _typo_csv(typo_row=0)), "classification", 0))["code"]
    assert codes.kind == "category" and codes.categories == ["0", "1", "2", "3", "X", "Y"]  # a third text: codes


def test_every_stray_value_of_a_number_column_is_named_at_once(tmp_path):
    """One run named one bad cell ('unknown' at row 30) of twelve: three runs to find '-' and '$52,000'."""
    lines = ["width,label"] + [f"{2 + i * 0.037:.3f},{'ab'[i % 2]}" for i in range(60)]
    for row, cell in ((12, "-"), (5, "unknown"), (40, "unknown"), (33, "$5"), (50, "unknown"), (51, "unknown")):
        lines[row] = f"{cell},{'ab'[row % 2]}"
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"column 'width', data row 5: 6 of the column's 60 present cells in the "
                                        r"training rows are not numbers, while 54 are: 'unknown' \(4: data rows 5, 40, 50, \.\.\.\), '-' "
                                        r"\(1: data row 12\), '\$5' \(1: data row 33\); fix those cells"):
        prepare(DataConfig(train=tmp_path / "m.csv", target="label", validation_split=0.0), "classification", 0)


def test_a_typo_in_any_row_is_named_whichever_split_it_lands_in(tmp_path):
    """Wherever the split puts the one text cell (training or held-out rows), the error names it."""
    for row in range(1, 41):
        with pytest.raises(DataError, match=rf"column 'width', data row {row}: ('3\.\.5' is not a number|.* are not "
                                            rf"numbers, .*'3\.\.5' \(1: data row {row}\))"):
            prepare(_cfg(tmp_path, _typo_csv(typo_row=row), validation_split=0.25), "classification", 0)


def _ids_csv(rows: int = 60) -> str:
    lines = ["customer_id,plan,width,label"] + [f"C{1000 + i},{'ab'[i % 3 == 0]},{i * 0.1:.1f},{'xy'[i % 2]}"
                                                for i in range(rows)]
    return "\n".join(lines) + "\n"


def test_an_identifier_column_is_refused_with_the_fix_not_one_hot_encoded(tmp_path):
    """A text column with a different value in every training row (C1000, C1001, ...) is an ID:
    as one-hot categories it gives one input per row that no new row matches (a newcomer's 100k-row
    file asked for 33.5 GiB and died of MemoryError). Declared types decide for themselves."""
    with pytest.raises(DataError, match=r"m\.csv: column 'customer_id' looks like an identifier: each of its 48 "
                                        r"present training cells is a different value") as caught:
        prepare(_cfg(tmp_path, _ids_csv(), validation_split=0.2), "classification", 0)
    assert "data.columns.customer_id: ignore" in str(caught.value)
    ignored = prepare(_cfg(tmp_path, _ids_csv(), columns={"customer_id": "ignore"}), "classification", 0)
    assert ignored.features == ["plan", "width"] and ignored.train.x.shape[1] == 3
    kept = prepare(_cfg(tmp_path, _ids_csv(), columns={"customer_id": "category"}), "classification", 0)
    assert _columns(kept)["customer_id"].kind == "category" and len(_columns(kept)["customer_id"].categories) == 60
    few = prepare(_cfg(tmp_path, _ids_csv(rows=12)), "classification", 0)  # a toy table: names may all differ
    assert _columns(few)["customer_id"].kind == "category"


def test_encoded_features_larger_than_memory_are_refused_before_allocating(tmp_path, monkeypatch):
    from magmadnn_cli.core import backend
    monkeypatch.setattr(backend, "host_memory_available", lambda: 15_000)  # bytes: the columns fit, not their one-hot inputs
    with pytest.raises(DataError, match=r"m\.csv: the encoded features would take .* \(60 rows x 63 inputs\); "
                                        r"the host has .* available\. The widest column: 'customer_id' \(60 inputs\)"):
        prepare(_cfg(tmp_path, _ids_csv(), columns={"customer_id": "category"}), "classification", 0)


@pytest.mark.parametrize("task,labels,loss", [("classification", "ab", "cross_entropy"), ("regression", "", "mse")])
def test_rows_without_a_target_are_left_out_and_named(tmp_path, capsys, task, labels, loss):
    """Blank, NA and ? in the target column are missing targets (as in feature columns): those rows
    are left out with a note naming them, as Ludwig drops them; they were a 5-class output error
    ('?', 'NA' read as classes) or 'regression targets must be numbers'."""
    lines = ["x,y"]
    for i in range(40):
        target = (labels[i % 2] if labels else f"{i * 0.5:.1f}") if i not in (3, 17, 30) else ["", "NA", "?"][i % 3]
        lines.append(f"{i * 0.1:.1f},{target}")
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    data = prepare(DataConfig(train=tmp_path / "t.csv", target="y", validation_split=0.0), task, 0)
    assert len(data.train.x) == 37
    assert data.classes == (["a", "b"] if labels else [])
    assert any("3 row(s) without a target (blank, NA, ?: data rows 4, 18, 31) left out" in n for n in data.notes), \
        data.notes
    config = tmp_path / "c.yaml"
    config.write_text(f"name: t\nseed: 0\ndata: {{train: t.csv, target: y}}\nmodel:\n  layers:\n    - {{type: dense, "
                      f"units: {2 if labels else 1}{', activation: softmax' if labels else ''}}}\nloss: {loss}\n"
                      "optimizer: {type: adam}\ntraining: {epochs: 1}\n")
    code, _, err = run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")
    assert code == 0, err
    code, out, err = run_cli(capsys, "evaluate", tmp_path / "run", tmp_path / "t.csv", "--json")
    assert code == 0 and json.loads(out)["rows"] == 37 and "data rows 4, 18, 31" in err, err


@pytest.mark.parametrize("targets,expected", [
    (["stayed", "churned", "upgraded"] * 10, r"the target holds labels \('churned', 'stayed', 'upgraded'\), not "
                                             r"numbers, but the loss is a regression loss: for classes use loss: cross_entropy"),
    (["", "NA"] + [f"{i}.5" for i in range(28)] + ["unknown", "$52"],  # rows without a target left out first
     r"a regression target must be a number; data row 31 has 'unknown' \(2 such row\(s\) in all\): fix or drop"),
])
def test_a_regression_on_text_targets_says_what_they_are(tmp_path, targets, expected):
    """`loss: mse` on labels said 'regression targets must be numbers (could not convert string to float:
    np.str_('stayed'))', after a config error had advised a linear output for that very loss."""
    (tmp_path / "t.csv").write_text("x,y\n" + "".join(f"{i},{t}\n" for i, t in enumerate(targets)))
    with pytest.raises(DataError, match=expected):
        prepare(DataConfig(train=tmp_path / "t.csv", target="y", validation_split=0.0), "regression", 0)


def test_a_class_with_too_few_rows_is_named_with_where_its_rows_went(tmp_path):
    """A class of 1 row trained without a word: train macro F1 0.56 (that class scored 0) against test
    0.85 (no row of it there, so left out of the average)."""
    labels = ["ok", "no"] * 30 + ["pending"] + ["hold"] * 4 + ["late"] * 5
    (tmp_path / "t.csv").write_text("x,y\n" + "".join(f"{i * 0.1:.1f},{y}\n" for i, y in enumerate(labels)))
    data = prepare(DataConfig(train=tmp_path / "t.csv", target="y", validation_split=0.0, test_split=0.2),
                   "classification", 0)
    note = next(n for n in data.notes if n.startswith("classes with fewer than 5 rows"))
    assert "'pending': 1 row (train 1, test 0); 'hold': 4 rows (train 3, test 1); collect more rows" in note, note
    assert "'late'" not in note
    balanced = prepare(DataConfig(train=tmp_path / "t.csv", target="y", label_map={"pending": "hold"},
                                  validation_split=0.0), "classification", 0)
    assert not any("fewer than 5" in n for n in balanced.notes)


def test_missing_tokens_are_missing_cells_in_every_column_and_the_target(tmp_path, capsys):
    """data.missing_tokens (pandas' na_values): a number column holding '-' and 'unknown' reads as
    numbers with missing cells (it was refused: 'not a number'), a category column's 'UNKNOWN ' is
    missing (not a category), a target 'unknown' row is left out; predict reads a new file so too."""
    lines = ["width,colour,label"] + [f"{2 + i * 0.25:.2f},{'rgb'[i % 3]},{'ab'[i % 2]}" for i in range(40)]
    lines[3], lines[8], lines[12], lines[20] = "-,r,b", "unknown,g,a", "3.5, UNKNOWN ,b", "4.0,b,unknown"
    text = "\n".join(lines) + "\n"
    with pytest.raises(DataError, match="'-' .*'unknown' .*go in data.missing_tokens"):
        prepare(_cfg(tmp_path, text), "classification", 0)
    data = prepare(_cfg(tmp_path, text, missing_tokens=["-", "Unknown"]), "classification", 0)
    cols = _columns(data)
    assert cols["width"].kind == "number" and cols["colour"].categories == ["(missing)", "b", "g", "r"]
    assert len(data.train.x) == 39 and any("1 row(s) without a target (blank, NA, ?, or data.missing_tokens: data rows 20)"
                                           in n for n in data.notes), data.notes
    widths = [float(line.split(",")[0]) for i, line in enumerate(lines) if i and i != 20  # row 20: no target
              and not line.startswith(("-", "unknown"))]
    assert len(widths) == 37 and cols["width"].fill == pytest.approx(np.median(widths))
    config = tmp_path / "c.yaml"
    config.write_text("name: t\nseed: 0\ndata: {train: m.csv, target: label, validation_split: 0.0, missing_tokens: "
                      "['-', Unknown]}\nmodel:\n  layers:\n    - {type: dense, units: 2, activation: softmax}\n"
                      "loss: cross_entropy\noptimizer: {type: adam}\ntraining: {epochs: 1}\n")
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    (tmp_path / "new.csv").write_text("width,colour\n-,r\n3.0,unknown\n3.0,r\n")
    code, out, err = run_cli(capsys, "predict", tmp_path / "run", tmp_path / "new.csv", "--proba")
    assert code == 0 and "width (1: median" in err and "colour (1: a category of its own '(missing)')" in err, err


def test_a_number_token_is_missing_in_a_number_column_whatever_else_the_file_or_chunk_holds(tmp_path, capsys):
    """missing_tokens: [-999] blanked -999 only where the column also held text (it was a text column
    then): the same row predicted differently by what else its file or chunk held."""
    from magmadnn_cli.commands.predict import predict
    lines = ["a,label"] + [f"{1 + (i % 7) * 0.5},{'ab'[i % 2]}" for i in range(40)]
    lines[5] = "-999,b"
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text("name: t\nseed: 0\ndata: {train: m.csv, target: label, validation_split: 0.0, missing_tokens: "
                      "[-999, '-']}\nmodel:\n  layers:\n    - {type: dense, units: 2, activation: softmax}\n"
                      "loss: cross_entropy\noptimizer: {type: adam}\ntraining: {epochs: 1}\n")
    assert run_cli(capsys, "train", config, "--out", tmp_path / "run", "-q")[0] == 0
    from magmadnn_cli.training.modelfile import load
    fill = load(tmp_path / "run" / "model.npz").encoder.columns[0].fill
    assert fill == np.median([float(line.split(",")[0]) for line in lines[1:] if not line.startswith("-999")])
    (tmp_path / "n.csv").write_text("a\n-999\n" + f"{fill}\n" + "2\n" * 4 + "-\n-999.0\n")  # '-' in a later chunk
    predict(tmp_path / "run", tmp_path / "n.csv", tmp_path / "p.csv", proba=True, chunk_rows=3)
    rows = (tmp_path / "p.csv").read_text().splitlines()[1:]
    assert rows[0] == rows[1] == rows[6] == rows[7] != rows[2], rows  # -999, '-' and -999.0 read as the fill


def test_training_names_every_columns_stray_cells_at_once_and_says_every_fill(tmp_path):
    """Two number columns with junk took two runs (one column a run); a fill other than auto's was
    never said in the run log."""
    lines = ["age,income,label"] + [f"{20 + i % 30},{1000 + i * 7},{'ab'[i % 2]}" for i in range(60)]
    lines[9], lines[4], lines[30] = "n/k,1063,b", "24,??,a", "49,,a"
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"m\.csv: 2 columns hold cells that cannot be read \(each from its first "
                                        r"row\):\n  column 'income', data row 4: .*'\?\?'.*\n  column 'age', data row 9: "):
        prepare(_cfg(tmp_path, "\n".join(lines) + "\n"), "classification", 0)
    lines[9], lines[4] = "29,1063,b", "24,1028,a"
    data = prepare(_cfg(tmp_path, "\n".join(lines) + "\n", missing_values="mean"), "classification", 0)
    mean = np.mean([float(line.split(",")[1]) for line in lines[1:] if line.split(",")[1]])
    assert "missing cells filled with the training rows' mean: income (1)" in " ".join(data.notes), data.notes
    assert _columns(data)["income"].fill == pytest.approx(mean)


def test_a_table_wide_median_fills_number_columns_and_the_rest_by_their_most_frequent_value(tmp_path):
    """data.missing_values: median on a table with a category column said 'data.columns.color: missing:
    median needs numbers' (a key the user never wrote); constant without a fill value blamed 'None'."""
    data = prepare(_cfg(tmp_path, missing_values="median"), "classification", 0)
    notes = " ".join(data.notes)
    assert "filled with the training rows' median: size" in notes and "most frequent value: color" in notes, notes
    with pytest.raises(DataError, match=r"column 'size' has missing cells and data.missing_values is constant, but no "
                                        r"fill value: give data.columns.size: \{missing: constant, fill_value: \.\.\.\}"):
        prepare(_cfg(tmp_path, missing_values="constant"), "classification", 0)


def test_a_file_with_no_targets_at_all_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("x,y\n1,\n2,NA\n")
    with pytest.raises(DataError, match=r"t\.csv: every row's target \(column 'y'\) is missing"):
        prepare(DataConfig(train=tmp_path / "t.csv", target="y", validation_split=0.0), "classification", 0)


def test_a_misspelt_feature_is_named_with_a_suggestion(tmp_path):
    with pytest.raises(DataError, match=r"missing feature column\(s\) colr \(data.features\); the file has .*; did you mean 'color'\?"):
        prepare(_cfg(tmp_path, features=["size", "colr"]), "classification", 0)


# -- constant columns (issue 28) -----------------------------------------------------------------
def test_constant_columns_are_noted_once_and_left_out_of_the_inputs(capsys, tmp_path):
    """A column with one value in every training row (a number, a category, all missing) adds
    nothing to learn from: it is left out of the network's inputs, said once; new rows are encoded
    without it; a missing indicator keeps a column whose only information is which cells are missing."""
    import json as _json
    from conftest import run_cli
    rng = np.random.default_rng(0)
    lines = ["a,b,site,empty,label"] + [f"{x:.3f},7,north,,{'hi' if x > 0 else 'lo'}" for x in rng.normal(size=80)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "c.yaml").write_text("name: k\nseed: 0\ndevice: cpu\ndata: {train: d.csv, target: label}\nmodel:\n"
                                     "  layers: [{type: dense, units: 2, activation: softmax}]\nloss: cross_entropy\n"
                                     "optimizer: {type: adam, learning_rate: 0.1}\ntraining: {epochs: 3, batch_size: 8}\n")
    code, out, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"))
    assert code == 0, err
    log = out + err
    assert log.count("constant columns left out of the inputs (one value in every training row): b, site, empty") == 1
    assert _json.loads((tmp_path / "run" / "metrics.json").read_text())["parameters"] == 2 * 1 + 2  # only `a`
    (tmp_path / "new.csv").write_text("a,b,site,empty\n1.5,9,south,3\n-1.5,7,north,\n")
    code, out, err = run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "new.csv"))
    assert code == 0 and out.split() == ["prediction", "hi", "lo"], err


def test_every_column_constant_is_refused(tmp_path):
    from magmadnn_cli.config.data import DataConfig
    from magmadnn_cli.errors import DataError
    raw = RawColumns(np.array([[1.0, 2.0], [1.0, 2.0]], np.float32))
    with pytest.raises(DataError, match="every feature column holds one value"):
        fit(raw, ["a", "b"], DataConfig(train="d.csv", target="y"), "d.csv")


def test_image_rows_keep_their_constant_pixels(tmp_path):
    from magmadnn_cli.config.data import DataConfig
    raw = RawColumns(np.array([[0.0, 1.0, 0.0, 2.0], [0.0, 3.0, 0.0, 4.0]], np.float32))
    encoder, _ = fit(raw, ["p0", "p1", "p2", "p3"], DataConfig(train="d.csv", target="y", shape=[1, 2, 2]), "d.csv")
    assert encoder.width == 4
    encoder, notes = fit(raw, ["p0", "p1", "p2", "p3"], DataConfig(train="d.csv", target="y"), "d.csv")
    assert encoder.width == 2 and encoder.transform(raw, "d.csv")[0].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert any("p0, p2" in n for n in notes)


def _mostly_unique_csv(cells) -> str:
    return "\n".join(["when,width,label"] + [f"{c},{i * 0.1:.1f},{'xy'[i % 2]}" for i, c in enumerate(cells)]) + "\n"


@pytest.mark.parametrize("cells,hint", [  # dates in one common format are read as dates (issue 44): below
    ([f"{1 + i % 12:02d}/{1 + i % 12:02d}/20{10 + i // 12}" for i in range(50)] + ["01/01/2010"] * 10,
     "they read as dates: set data.date_format ('%m/%d/%Y' or '%d/%m/%Y')"),
    ([f"${100 + 7 * i:,}.50" for i in range(45)] + ["$100.50"] * 15, "they look like numbers with '$' signs"),
    ([f"{i}%" for i in range(40)] + ["5%"] * 20, "they look like numbers with '%' signs"),
    ([f"item {i}" for i in range(40)] + ["item 0"] * 20, ""),
])
def test_a_text_column_of_mostly_distinct_values_is_named_with_what_it_looks_like(tmp_path, cells, hint):
    """A newcomer's MM/DD/YYYY dates, '$1,234.50' prices and '16%' discounts were one-hot encoded into
    hundreds of inputs, most seen once (R^2 0.08), without a word; only an all-distinct column was refused."""
    text = _mostly_unique_csv(cells)
    data = prepare(_cfg(tmp_path, text, validation_split=0), "classification", 0)
    said = next((n for n in data.notes if "different values" in n), "")
    assert re.search(r"column 'when' has \d+ different values in its 60 present training cells", said), data.notes
    assert hint in said and "data.columns.when: ignore" in said, said
    declared = prepare(_cfg(tmp_path, text, columns={"when": "category"}), "classification", 0)
    assert _columns(declared)["when"].kind == "category" and not any("different values" in n for n in declared.notes)
    repeated = _mostly_unique_csv([cells[i % 20] for i in range(60)])  # 20 values in 60 rows: categories
    assert not any("different values" in n for n in prepare(_cfg(tmp_path, repeated), "classification", 0).notes)


def test_the_date_format_hint_looks_at_dates_spread_over_the_column(tmp_path):
    """Three years of day-first dates: sorted, the first 200 values all begin 01-06 and read both
    ways; the later ones (13/01/2020) decide. Read as dates in that format (issue 44: it was refused,
    naming the very format)."""
    import datetime
    days = [(datetime.date(2020, 1, 1) + datetime.timedelta(days=i)).strftime("%d/%m/%Y") for i in range(3 * 365)]
    when = _columns(prepare(_cfg(tmp_path, _mostly_unique_csv(days), validation_split=0), "classification", 0))["when"]
    assert (when.kind, when.date_format) == ("date", "%d/%m/%Y")


@pytest.mark.parametrize("cells", [[f"{1 + i % 12:02d}/{1 + i % 28:02d}/2023" for i in range(60)],
                                   [f"{1 + i % 12:02d}/{1 + i % 28:02d}/2023" for i in range(50)] + ["12/31/2023"] * 10,
                                   [f"{1 + i % 12:02d}/15/2023" for i in range(60)]])
def test_an_identifier_of_dates_says_how_to_read_them(tmp_path, cells):
    """Dates in one common format, all distinct, mostly distinct or a few repeated, were refused or
    one-hot encoded naming the format: they are read as dates in it (issue 44)."""
    data = prepare(_cfg(tmp_path, _mostly_unique_csv(cells), validation_split=0), "classification", 0)
    when = _columns(data)["when"]
    assert (when.kind, when.date_format) == ("date", "%m/%d/%Y") and not any("different values" in n for n in data.notes)


def test_a_number_column_of_distinct_consecutive_whole_numbers_is_named_as_a_likely_id(tmp_path):
    """A newcomer's house IDs written as numbers (1000, 1001, ...) were an input without a word; a
    spreadsheet's exported row numbers are the same trap. Counts and measures are not named."""
    rng = np.random.default_rng(0)
    rows = [f"{1000 + i},{rng.integers(1, 6)},{i % 40},{rng.normal():.3f},{'xy'[i % 2]}" for i in range(60)]
    text = "house_id,rooms,age,size,label\n" + "\n".join(rows) + "\n"
    data = prepare(_cfg(tmp_path, text, validation_split=0.2), "classification", 0)
    said = [n for n in data.notes if "whole number" in n]
    assert len(said) == 1 and "column 'house_id' holds a different whole number in every training row" in said[0]
    assert "data.columns.house_id: ignore" in said[0], said
    quiet = prepare(_cfg(tmp_path, text, validation_split=0.2, columns={"house_id": "number"}), "classification", 0)
    assert not any("whole number" in n for n in quiet.notes)


@pytest.mark.parametrize("name,said", [("Year", None), ("t", "(or a year per row: then keep it)")])
def test_a_yearly_series_is_not_taken_for_an_id(tmp_path, name, said):
    rng = np.random.default_rng(0)
    rows = [f"{1961 + i},{rng.normal():.3f},{'xy'[i % 2]}" for i in range(60)]
    data = prepare(_cfg(tmp_path, f"{name},size,label\n" + "\n".join(rows) + "\n", validation_split=0),
                   "classification", 0)
    notes = [n for n in data.notes if "whole number" in n]
    assert notes == [] if said is None else (len(notes) == 1 and said in notes[0]), notes


def _disguised(copy, task: str) -> str:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(60):
        t, lab = round(float(rng.normal()), 3), "xy"[i % 2]
        rows.append(f"{rng.normal():.3f},{copy(i, t, lab)},{'abc'[i % 3]},{t if task == 'regression' else lab}")
    return "size,copy,kind,label\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize("task,copy,honest", [
    ("regression", lambda i, t, lab: f"{3 * t + 1:.4f}", lambda i, t, lab: f"{3 * t + 1 + (i % 5) * 0.1:.4f}"),
    ("classification", lambda i, t, lab: {"x": "code7", "y": "code9"}[lab],
     lambda i, t, lab: {"x": "code7", "y": "code9"}[lab] if i % 5 else "code7"),
])
def test_a_feature_that_is_the_target_in_disguise_is_named(tmp_path, task, copy, honest):
    """A newcomer's sales file held units_copy, the target again: the model learnt to read it and
    scored perfectly, without a word. A column that is close to the target is a feature."""
    data = prepare(_cfg(tmp_path, _disguised(copy, task), validation_split=0.2), task, 0)
    said = [n for n in data.notes if "copy of the answer" in n]
    assert len(said) == 1 and "column(s) 'copy' " in said[0] and "data.columns.copy: ignore" in said[0], data.notes
    kept = prepare(_cfg(tmp_path, _disguised(honest, task), validation_split=0.2), task, 0)
    assert not any("copy of the answer" in n for n in kept.notes), kept.notes


@pytest.mark.parametrize("cells,hint", [
    ([f"{5 * (i % 8)}%" for i in range(60)], "but they look like numbers with '%' signs"),
])
def test_a_category_column_of_signed_numbers_or_dates_says_how_to_read_it(tmp_path, cells, hint):
    """A newcomer's '16%' discounts (40 values in 270 rows) became 40 one-hot inputs without a word."""
    data = prepare(_cfg(tmp_path, _mostly_unique_csv(cells), validation_split=0), "classification", 0)
    said = [n for n in data.notes if "column 'when' is read as" in n]
    assert len(said) == 1 and hint in said[0], data.notes


def test_the_final_table_keeps_one_number_style_per_column_and_names_the_losss_units(capsys, tmp_path):
    """A newcomer saw rmse 342.2284 above 33,739 in one column, and a loss of 0.1164 beside an mse of
    1,138,322,432 with nothing saying the loss is on the standardized target."""
    from rich.console import Console

    from magmadnn_cli.reporting import metrics_table
    console = Console(width=120, record=True)
    console.print(metrics_table("t", {"train": {"loss": 0.1164, "rmse": 342.2284},
                                      "validation": {"loss": 0.2, "rmse": 33_739.4}}, caption="units"))
    text = console.export_text()
    assert "342 " in text and "33,739" in text and "342.2284" not in text and "0.1164" in text, text
    console.print(metrics_table("t", {"train": {"r2": 0.9512}, "test": {"r2": -31_000.5}}))
    assert "0.9512" in console.export_text(), "a column with values below 1 keeps each cell's own style"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 2))
    text = "a,b,label\n" + "".join(f"{a:.4f},{b:.4f},{250_000 + 40_000 * a:.2f}\n" for a, b in x)
    (tmp_path / "train.csv").write_text(text)
    (tmp_path / "c.yaml").write_text("name: r\ndata: {train: train.csv, target: label}\nloss: mse\n"
                                     "model: {layers: [{type: dense, units: 1}]}\noptimizer: {type: adam}\ntraining: {epochs: 2}\n")
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "run")
    assert code == 0 and "loss: on the standardized target (data.target_normalize)" in " ".join(out.split()), err
    code, out, err = run_cli(capsys, "train", tmp_path / "c.yaml", "--out", tmp_path / "raw",
                             "--set", "data.target_normalize=none")
    assert code == 0 and "standardized target" not in out, out
