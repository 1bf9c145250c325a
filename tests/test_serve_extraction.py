"""Pulling a request's values out of its JSON records (issue 47, 256-row requests): records whose keys
come in the model's order give their values as they are (no lookup per key); any other order is looked
up; either way the compiled encoding's rows are the general path's bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest

from magmadnn_cli.commands.serve import compiled as compiled_module
from magmadnn_cli.commands.serve.compiled import Compiled
from serve_helpers import HEART_NAMES, digits_rows, heart_rows, loaded_models, records
from test_serve_fastpath import encoded_both_ways


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return loaded_models(tmp_path_factory.mktemp("models"))


def bodies(name: str) -> list[dict]:
    """Records of the model's rows: digits (64 number columns, JSON numbers of every kind), or heart
    (categories, missing cells)."""
    if name == "heart":
        return records(HEART_NAMES, heart_rows(count=90, start=100))
    names, rows = digits_rows(count=90)
    body = records(names, rows)
    for i, record in enumerate(body):  # ints, floats, -0.0, integers past 2**53
        record[names[i % 64]] = [-0.0, 2**53 + 1, 3.25, 7, 1e-310][i % 5]
    return body


def reordered(record: dict, rng: random.Random) -> dict:
    keys = list(record)
    rng.shuffle(keys)
    return {k: record[k] for k in keys}


@pytest.mark.parametrize("name", ["digits", "heart"])
def test_records_in_any_key_order_give_the_general_paths_rows_bit_for_bit(models, name):
    model, spec = models[name]
    body, rng = bodies(name), random.Random(0)
    mixed = [reordered(r, rng) if i % 3 == 0 else r for i, r in enumerate(body)]
    for payload in (body, {"dataframe_records": body}, [reordered(r, rng) for r in body], mixed, body[:1],
                    [reordered(body[0], rng)]):
        fast, general = encoded_both_ways(model, spec, payload)
        assert fast is not None and fast.dtype == general.dtype
        assert (fast.flags.c_contiguous, fast.flags.f_contiguous) == (general.flags.c_contiguous,
                                                                      general.flags.f_contiguous)  # as BLAS reads it
        np.testing.assert_array_equal(fast, general)


@pytest.mark.parametrize("name", ["digits", "heart"])
def test_records_in_the_models_order_are_read_without_a_lookup_per_key(models, name, monkeypatch):
    model, spec = models[name]
    body = bodies(name)
    expected = encoded_both_ways(model, spec, body)[1]

    def refused(*names):
        raise AssertionError("a lookup per key of records in the model's order")
    monkeypatch.setattr(compiled_module, "itemgetter", refused)
    with model.using():
        fast = Compiled(model, spec).from_json(body)
    assert fast is not None
    np.testing.assert_array_equal(fast[1], expected)


@pytest.mark.parametrize("value", [True, "3", 2**1100, [1.0], {"a": 1}, float("inf")])
@pytest.mark.parametrize("ordered", [True, False])
def test_what_a_number_model_does_not_take_goes_the_general_way(models, value, ordered):
    model, spec = models["digits"]
    body = bodies("digits")[:8]
    body[5] = {**body[5], next(iter(body[5])): value}
    if not ordered:
        body[2] = reordered(body[2], random.Random(1))
    with model.using():
        assert Compiled(model, spec).from_json(body) is None


def test_records_with_the_models_keys_and_others_go_the_general_way(models):
    model, spec = models["digits"]
    body = bodies("digits")[:4]
    first = next(iter(body[1]))
    body[1] = {("x" if k == first else k): v for k, v in body[1].items()}  # as long, one key not the model's
    with model.using():
        assert Compiled(model, spec).from_json(body) is None

