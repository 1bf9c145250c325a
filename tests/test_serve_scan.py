"""JSON bodies of plain numbers read straight from their bytes (issue 47, 256-row requests for models
of number columns): the numbers are the bits the current parser gives (then float(), as the general
path reads them), the encoded rows the general path's bit for bit, and anything not exactly that form
goes the general way."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from pydantic_core import from_json

from magmadnn_cli.commands.serve import bodies as bodies_module
from magmadnn_cli.commands.serve import scan
from magmadnn_cli.commands.serve.batching import Job
from magmadnn_cli.commands.serve.bodies import parse
from magmadnn_cli.commands.serve.compiled import Compiled
from serve_helpers import HEART_NAMES, digits_rows, heart_rows, loaded_models, records
from test_serve_fastpath import awkward_numbers, encoded_both_ways

NAMES = ["a", "b_1", "c", "d2"]
EXTRA = ["-0", "0", "-0.0", "0e0", "-0e0", "1E+05", "1e-320", "4.9e-324", str(2**70), str(-2**70), "9007199254740993",
         "0.1", "1e400", "-1e400", "12345678", "-1234567", "1234567.8", "-0.000001"]


def forms(names: list[str], rows: list[list[str]]) -> dict[str, bytes]:
    """The body forms clients send, of number tokens as written (rows of text)."""
    def record(row: list[str], colon: str, comma: str) -> str:
        return "{" + comma.join(f'"{n}"{colon}{v}' for n, v in zip(names, row)) + "}"
    compact = "[" + ",".join(record(r, ":", ",") for r in rows) + "]"
    spaced = "[" + ", ".join(record(r, ": ", ", ") for r in rows) + "]"
    data = "[" + ", ".join("[" + ", ".join(r) + "]" for r in rows) + "]"
    columns = json.dumps(names)
    return {"records": compact.encode(), "spaced": spaced.encode(),
            "dataframe_records": f'{{"dataframe_records": {spaced}}}'.encode(),
            "dataframe_split": f'{{"dataframe_split": {{"columns": {columns}, "data": {data}}}}}'.encode(),
            "split": f'{{"columns": {columns}, "data": {data}}}'.encode(),
            "split_data_first": f'{{"data":{data.replace(", ", ",")},"columns":{columns.replace(", ", ",")}}}'.encode()}


def reference(body: bytes) -> np.ndarray:
    """The values as the general path reads them: pydantic-core's parser, then float() of each."""
    payload = from_json(body, allow_inf_nan=True)
    if isinstance(payload, dict):
        payload = payload.get("dataframe_records", payload.get("dataframe_split", payload))
    rows = payload["data"] if isinstance(payload, dict) else [list(r.values()) for r in payload]
    return np.array([[float(v) for v in row] for row in rows])


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.int64)


def test_awkward_numbers_read_to_the_bits_of_the_general_path(monkeypatch):
    monkeypatch.setattr(scan, "SLOW", 1.0)  # every token may be read one at a time
    numbers = EXTRA + awkward_numbers(2000, seed=3)
    numbers = numbers[:len(numbers) // 4 * 4]
    rows = [numbers[i:i + 4] for i in range(0, len(numbers), 4)]
    for form, body in forms(NAMES, rows).items():
        found = scan.numbers(body, scan.Layout(NAMES))
        assert found is not None, form
        np.testing.assert_array_equal(bits(found), bits(reference(body)), err_msg=form)
    assert np.signbit(scan.numbers(b'[{"a":-0,"b_1":-0.0,"c":-0e0,"d2":0}]', scan.Layout(NAMES))).tolist() == \
        [[False, True, True, False]]  # "-0" is the integer 0, as float(0); "-0.0" is -0.0


def test_short_decimals_are_read_eight_bytes_at_a_time_to_the_same_bits(monkeypatch):
    rng = random.Random(5)
    numbers = EXTRA[:2] + [rng.choice(["", "-"]) + str(rng.randint(0, 10 ** rng.randint(0, 7)))
                           + rng.choice(["", "." + str(rng.randint(0, 10 ** rng.randint(0, 4))).zfill(rng.randint(1, 4))])
                           for _ in range(4000)]
    numbers = [n if len(n) <= 8 else n[:8].rstrip(".") for n in numbers][:4000]
    rows = [numbers[i:i + 4] for i in range(0, len(numbers), 4)]
    monkeypatch.setattr(scan, "float", lambda *a: pytest.fail("a short decimal read one at a time"), raising=False)
    for form, body in forms(NAMES, rows).items():
        found = scan.numbers(body, scan.Layout(NAMES))
        assert found is not None, form
        np.testing.assert_array_equal(bits(found), bits(reference(body)), err_msg=form)


@pytest.mark.parametrize("value", ["01", "-01.5", "1.", ".5", "+1", "-", "1 2", "1 ", "NaN", "Infinity", "-Infinity",
                                   "null", "true", '"1"', "[1]", '{"x": 1}', "1.5.2", "1e", "0x10", "1_000", "--1",
                                   str(2 ** 1100), "1e5e5"])
def test_a_body_not_exactly_of_plain_numbers_goes_the_general_way(value, monkeypatch):
    monkeypatch.setattr(scan, "SLOW", 1.0)
    body = forms(NAMES, [["1", "2.5", "3", "4"], ["5", value, "7", "8"]])
    for form, text in body.items():
        assert scan.numbers(text, scan.Layout(NAMES)) is None, (form, value)


@pytest.mark.parametrize("body", [
    b'[{"a":1,"b_1":2,"c":3,"d2":4},]', b'[{"a":1,"b_1":2,"c":3}]', b'[{"a":1,"b_1":2,"c":3,"d2":4,"e":5}]',
    b'[{"b_1":2,"a":1,"c":3,"d2":4}]', b'[{"\\u0061":1,"b_1":2,"c":3,"d2":4}]', b'[{"a" :1,"b_1":2,"c":3,"d2":4}]',
    b'[ {"a": 1, "b_1": 2, "c": 3, "d2": 4}]', b'\xef\xbb\xbf[{"a":1,"b_1":2,"c":3,"d2":4}]', b"[]",
    b'{"instances":[{"a":1,"b_1":2,"c":3,"d2":4}],"x":1}', b'{"columns":["a","b_1","c","d2"],"data":[[1,2,3]]}',
    b'{"columns":["a","b_1","d2","c"],"data":[[1,2,3,4]]}', b'{"columns":["a","b_1","c","d2"],"data":[[1,2,3,4]],'
    b'"index":[0]}', b'[{"a":1,"b_1":2,"c":3,"d2":4}]x', b'[{"a":1,"b_1":2,"c":3,"d2":4}',
    b'{"dataframe_split":{"columns":["a","b_1","c","d2"],"data":[[1,2,3,4],[5,6,7]]}}',
    json.dumps([dict(zip(NAMES, [1, 2, 3, 4]))], indent=2).encode()])
def test_other_shapes_keys_orders_and_spacing_go_the_general_way(body):
    assert scan.numbers(body, scan.Layout(NAMES)) is None


def test_a_body_of_many_long_numbers_goes_the_general_way():
    rows = [[repr(random.Random(i).random()) for _ in NAMES] for i in range(64)]
    assert scan.numbers(forms(NAMES, rows)["records"], scan.Layout(NAMES)) is None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return loaded_models(tmp_path_factory.mktemp("models"))


def test_a_number_models_rows_from_bytes_are_the_general_paths_bit_for_bit(models, monkeypatch):
    model, spec = models["digits"]
    names, rows = digits_rows(count=120)
    rows = [[c if i % 3 else f"{float(c)}" for i, c in enumerate(r)] for r in rows]  # 7 and 7.0
    rows[5][3], rows[6][4], rows[7][5] = "-0", "-0.0", "1e-320"
    compiled = Compiled(model, spec)
    monkeypatch.setattr(bodies_module, "_json", lambda body: pytest.fail("the body went through the JSON parser"))
    for form, body in forms(names, rows).items():
        with model.using():
            fast = compiled.from_bytes(body)
            table, x = parse(Job(body, "application/json", False, lambda rows, exc: None), spec, compiled)
        general = encoded_both_ways(model, spec, json.loads(body))[1]
        assert fast is not None and len(table.raw.x) == len(rows), form
        for found in (fast[1], x):
            assert found.dtype == general.dtype and found.flags.c_contiguous == general.flags.c_contiguous
            np.testing.assert_array_equal(bits(found.astype(np.float64)), bits(general.astype(np.float64)))


def test_models_with_text_columns_and_refused_cells_go_the_general_way(models):
    model, spec = models["heart"]
    assert Compiled(model, spec).from_bytes(json.dumps(records(HEART_NAMES, heart_rows(count=5))).encode()) is None
    digits, digits_spec = models["digits"]
    names, rows = digits_rows(count=3)
    rows[1][2] = "1e400"  # an infinite cell: the general path names it
    with digits.using():
        assert Compiled(digits, digits_spec).from_bytes(forms(names, rows)["records"]) is None
