"""The served request's fast path (issue 47, 256-row requests): a JSON body parsed by pydantic-core's
parser reads exactly as Python's json reads it, and columns of JSON values become cells a column at a
time; the tables (and so the answers) are those the slow path gives."""

from __future__ import annotations

import json
import random

import numpy as np
import pydantic_core
import pytest

from magmadnn_cli.commands.serve.batching import Job
from magmadnn_cli.commands.serve.bodies import BadRequest, parse
from magmadnn_cli.data import records as records_module
from magmadnn_cli.data.records import json_table
from magmadnn_cli.inference import Predictor, read_spec
from serve_helpers import HEART_NAMES, heart_rows, records, train_models


@pytest.fixture(scope="module")
def heart(tmp_path_factory):
    model = Predictor(train_models(tmp_path_factory.mktemp("models"), ("heart",))["heart"], "cpu")
    with model.using():
        return model, read_spec(model.path, model.saved, False)


def body_table(spec, body: bytes, content_type: str = "application/json"):
    return parse(Job(body, content_type, False, lambda rows, exc: None), spec)[0]


def same(a, b) -> None:
    assert a.features == b.features
    np.testing.assert_array_equal(a.raw.x, b.raw.x)  # NaN where NaN, bit for bit elsewhere
    assert a.raw.x.dtype == b.raw.x.dtype and a.raw.text.keys() == b.raw.text.keys()
    for j in a.raw.text:
        assert a.raw.text[j].tolist() == b.raw.text[j].tolist()


def awkward_numbers(count: int, seed: int = 0) -> list[str]:
    """Numbers as JSON clients write them: shortest reprs of random doubles over the whole exponent
    range, long decimal expansions, exponents in E form, subnormals, -0, integers past 2**53."""
    rng = random.Random(seed)
    found = ["0", "-0.0", "5e-324", "2.2250738585072014e-308", "1.7976931348623157e+308", "1E5", "1e-7",
             "0.1", "9007199254740993", "123456789012345678901234567890", "0.30000000000000004",
             "1.00000000000000011102230246251565404236316680908203125"]
    while len(found) < count:
        value = rng.uniform(-1, 1) * 10.0 ** rng.randint(-320, 308)
        found.append(rng.choice([repr(value), f"{value:.25e}", f"{value:.17g}", str(rng.randint(-2**70, 2**70))]))
    return found


def test_json_numbers_read_as_pythons_json_reads_them(heart):
    _, spec = heart
    numbers = awkward_numbers(2000)  # a number column and a category column (its cells as text); others missing
    nulls = "".join(f', "{name}": null' for name in HEART_NAMES if name not in ("age", "cp"))
    body = "[" + ", ".join(f'{{"age": {n}, "cp": {n}{nulls}}}' for n in numbers) + "]"
    assert json.loads(body)[1]["age"] == -0.0
    same(body_table(spec, body.encode()), json_table(json.loads(body), spec, "request"))


def test_bad_json_is_still_named_by_pythons_parser(heart):
    _, spec = heart
    with pytest.raises(BadRequest, match=r"not JSON \(Expecting ',' delimiter: line 1 column 13"):
        body_table(spec, b'[{"age": 41 "sex": 1}]')
    blank = {name: None for name in HEART_NAMES}
    lone = json.dumps([dict(blank, age=41, cp="\ud800")])  # a lone surrogate's escape: Python's json takes it
    assert "\\ud800" in lone
    same(body_table(spec, lone.encode()), json_table(json.loads(lone), spec, "request"))
    plain = json.dumps([dict(blank, age=41)])
    same(body_table(spec, b"\xef\xbb\xbf" + plain.encode()), json_table(json.loads(plain), spec, "request"))  # a BOM


def test_columns_of_json_values_become_cells_without_a_call_per_cell(heart, monkeypatch):
    _, spec = heart
    rows = heart_rows(count=60, start=160)  # rows holding '?' (nulls in JSON)
    body = records(HEART_NAMES, rows)
    for i, record in enumerate(body):
        record["thal"] = None if i % 7 == 0 else record["thal"]
        record["slope"] = str(record["slope"]) if record["slope"] is not None else None  # text a client sends
    expected = json_table(body, spec, "request")
    calls = []
    original = records_module.json_cell
    monkeypatch.setattr(records_module, "json_cell", lambda *a: calls.append(a) or original(*a))
    same(json_table(body, spec, "request"), expected)
    assert calls == []
    mixed = [dict(r, cp=True if i == 3 else r["cp"]) for i, r in enumerate(body)]  # a boolean among numbers
    same(json_table(mixed, spec, "request"), expected_with(mixed, spec, original))


def expected_with(body, spec, cell):
    """The table with every text cell made by `cell`, one at a time (the reference)."""
    table = json_table(body, spec, "request")
    for j, column in table.raw.text.items():
        name = table.features[j]
        made = np.array([cell(r.get(name), name, "request", i) for i, r in enumerate(body)], dtype=str)
        made = np.char.strip(made)
        assert np.where(np.isin(np.char.lower(made), ["", "?", "nan"]), "", made).tolist() == column.tolist()
    return table


def encoded_both_ways(model, spec, payload):
    """(the compiled encoding's rows or None, the general path's: json_table, then encode)."""
    from magmadnn_cli.commands.serve.compiled import Compiled
    from magmadnn_cli.inference import new_tally
    with model.using():
        fast = Compiled(model, spec).from_json(payload)
        return (None if fast is None else fast[1]), model.encoded(json_table(payload, spec, "request"), False,
                                                                  new_tally())


def test_the_compiled_encoding_gives_the_general_paths_rows_bit_for_bit(heart):
    model, spec = heart
    rows = heart_rows(count=120, start=100)  # '?' cells: nulls
    body = records(HEART_NAMES, rows)
    for i, record in enumerate(body):  # categories as clients send them: numbers, text, spaced, unseen
        record["cp"] = [record["cp"], f" {record['cp']} ", str(record["cp"]), 9, "NA", None][i % 6]
        record["thal"] = [record["thal"], float(record["thal"] or 3), "?"][i % 3]
        record["age"] = [record["age"], None, float(record["age"])][i % 3]
    split = {"columns": HEART_NAMES, "data": [[r[n] for n in HEART_NAMES] for r in body]}
    turned = {"columns": HEART_NAMES[::-1], "data": [[r[n] for n in HEART_NAMES[::-1]] for r in body]}
    for payload in (body, {"dataframe_records": body}, {"dataframe_split": split}, split, body[:1], turned):
        fast, general = encoded_both_ways(model, spec, payload)
        assert fast is not None and fast.dtype == general.dtype and fast.flags.c_contiguous
        np.testing.assert_array_equal(fast, general)


@pytest.mark.parametrize("change", [
    lambda r: r.pop("age"),                     # a column missing: the general path names it
    lambda r: r.update(agee=1),                 # a column the model does not read
    lambda r: r.update(cp={"a": 1}),            # not a flat value
    lambda r: r.update(age="41"),               # text in a number column
    lambda r: r.update(age=True),               # a boolean in a number column
    lambda r: r.update(age=1e300),              # beyond float32: refused by cell
    lambda r: r.update(chol=2**1100),           # beyond float64
    lambda r: r.update(age=[41]),               # not a flat value, in a number column
])
def test_what_the_compiled_encoding_does_not_take_goes_the_general_way(heart, change):
    model, spec = heart
    body = records(HEART_NAMES, heart_rows(count=5))
    change(body[2])
    from magmadnn_cli.commands.serve.compiled import Compiled
    with model.using():
        assert Compiled(model, spec).from_json(body) is None


def csv_both_ways(model, spec, text):
    from magmadnn_cli.commands.serve.compiled import Compiled
    from magmadnn_cli.data.records import csv_table
    from magmadnn_cli.inference import new_tally
    with model.using():
        fast = Compiled(model, spec).from_csv(text, spec)
        return (None if fast is None else fast[1]), model.encoded(csv_table(text, spec, "request"), False, new_tally())


def test_csv_bodies_encoded_by_the_compiled_encoding_give_the_general_paths_rows(heart):
    model, spec = heart
    rows = [list(r) for r in heart_rows(count=150, start=100)]  # '?' cells
    for i, row in enumerate(rows):  # cells as people write them: spaced, NA, nan, unseen, 1 for 1.0
        row[2] = [row[2], f" {row[2]} ", "NA", "9", row[2].replace(".0", ""), ""][i % 6]
        row[0] = [row[0], f" {row[0]}", "nan", "NaN", "1e2", row[0]][i % 6]
    order = HEART_NAMES[::-1]  # columns in another order
    for names, cells, header in ((HEART_NAMES, rows, True), (order, [r[::-1] for r in rows], True),
                                 (HEART_NAMES, rows, False), (HEART_NAMES, rows[:1], True)):
        text = ("" if not header else ",".join(names) + "\n") + "".join(",".join(r) + "\n" for r in cells)
        fast, general = csv_both_ways(model, spec, text)
        assert fast is not None and fast.dtype == general.dtype and fast.flags.c_contiguous
        np.testing.assert_array_equal(fast, general)


@pytest.mark.parametrize("change", [
    lambda text: text.replace("\n", "\r\n"),           # Windows line ends: the line reader's
    lambda text: text.replace("63.0", '"63.0"', 1),     # a quoted cell
    lambda text: text.replace("63.0", "sixty", 1),      # text in a number column (named by the line reader)
    lambda text: text.replace("63.0", "63.0,1", 1),     # a ragged row
    lambda text: text.replace("age,", "", 1),           # a column missing
    lambda text: text.replace("63.0", "1e39", 1),       # beyond float32
])
def test_csv_the_compiled_encoding_does_not_take_goes_the_general_way(heart, change):
    model, spec = heart
    from magmadnn_cli.commands.serve.compiled import Compiled
    rows = heart_rows(count=4, start=0)
    assert rows[0][0] == "63.0"
    text = change(",".join(HEART_NAMES) + "\n" + "".join(",".join(r) + "\n" for r in rows))
    with model.using():
        assert Compiled(model, spec).from_csv(text, spec) is None


def test_a_split_body_naming_odd_columns_goes_the_general_way(heart):
    model, spec = heart
    from magmadnn_cli.commands.serve.compiled import Compiled
    data = [[1] * len(HEART_NAMES)]
    with model.using():
        compiled = Compiled(model, spec)
        for columns in ([{"a": 1}] + HEART_NAMES[1:], HEART_NAMES[:-1] + ["age"], HEART_NAMES[:-1]):
            assert compiled.from_json({"columns": columns, "data": data}) is None


def test_nan_cells_share_one_entry_of_a_columns_table(heart):
    """JSON NaN in a category column (pandas' missing value, as json.dumps writes it) is one value of
    the column's table, however many requests send it: the table does not fill up with NaNs, and
    a later request with a value not yet seen still takes the compiled encoding."""
    from magmadnn_cli.commands.serve.compiled import CACHED, Compiled
    model, spec = heart
    rows = heart_rows(count=50, start=0)
    with model.using():
        compiled = Compiled(model, spec)
        body = json.dumps([{**r, "cp": float("nan")} for r in records(HEART_NAMES, rows)]).encode()
        for _ in range(CACHED // len(rows) + 2):  # parsed afresh each time: a new NaN object a cell
            assert compiled.from_json(pydantic_core.from_json(body, allow_inf_nan=True)) is not None
        later = [{**r, "cp": "2"} for r in records(HEART_NAMES, rows[:5])]
        fast, general = encoded_both_ways(model, spec, later)
        assert fast is not None
        np.testing.assert_array_equal(fast, general)
