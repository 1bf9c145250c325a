"""ONNX ops that read a raw cell as `predict` reads it: text matched without the whitespace around it
(Python's whole str.isspace set), missing words in any case (RE2 `RegexFullMatch`, opset 20), number
tokens by value, booleans, and categories one-hot (one CategoryMapper lookup unless a cell must be
stripped); codes compared as numbers within a double's range, written in any script's digits
('٢', '२', '２' are 2 to float(), so to `predict`). Built on `training/onnx_graph.Graph`; each column kind's form (`column_kinds.py`) is made of them."""

from __future__ import annotations

import math
import sys
import unicodedata
from functools import lru_cache
from typing import Any

import numpy as np

from . import dates
from .cells import FALSE, MISSING, TRUE, MissingTokens

Graph = Any  # training/onnx_graph.Graph: the builder every column kind's ONNX form writes into

DATE_INPUT = ("a date: float64 seconds since 1970-01-01 00:00 of its wall-clock time as written (a UTC offset or Z "
              "dropped, not applied, as predict reads it; NaN: missing)")
# what Python's str.strip() removes (str.isspace), as an RE2 character class
SPACE_CHAR = r"[\t-\r\x{1C}-\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]"
SPACE = SPACE_CHAR + "*"
# what Cast reads as a number without overflowing its double (onnxruntime's Cast stops the graph otherwise)
NUMBER = r"[\t-\r ]*[+-]?(?:[0-9]{1,40}\.?[0-9]{0,40}|\.[0-9]{1,40})(?:[eE][+-]?0{0,20}[0-9]{1,2})?[\t-\r ]*"


def number_tokens(g: Graph, values: str, tokens: MissingTokens) -> str:
    """`values` with the number tokens as NaN (missing), as the readers read them."""
    if not tokens.numbers:
        return values
    return g.op("Where", _equals_any(g, values, tokens.numbers, np.float32), g.const(float("nan"), "nan"), values)


def text_missing(g: Graph, cells: str, tokens: MissingTokens) -> str:
    """(N, 1) bool: a text cell is missing: a reader's token or a word of `tokens` (any case, spaces
    around ignored), or a number equal to a number token ('-999.0' for -999, '-٩٩٩' too)."""
    missing = _matches(g, cells, (*MISSING, *tokens.words), fold_case=True)
    if not tokens.numbers:
        return missing
    values = _as_value(g, cells, g.onnx.TensorProto.DOUBLE)
    spelled = [g.op("RegexFullMatch", cells, pattern=spelled_number(_positional(n, np.float64)))
               for n in tokens.numbers]
    return g.op("Or", missing, _any(g, [_equals_any(g, values, tokens.numbers, np.float64), *spelled]))


def _any(g: Graph, flags: list[str]) -> str:
    hit = flags[0]
    for flag in flags[1:]:
        hit = g.op("Or", hit, flag)
    return hit


@lru_cache(maxsize=None)
def _digits() -> dict[int, list[int]]:
    """The code points of every character float() reads as a digit (Unicode decimal digits), by value."""
    found: dict[int, list[int]] = {d: [] for d in range(10)}
    for i in range(sys.maxunicode + 1):
        value = unicodedata.decimal(chr(i), None)
        if value is not None:
            found[value].append(i)
    return found


def digit_class(value: int) -> str:
    """An RE2 class of every character float() reads as the digit `value`."""
    return "[" + "".join(f"\\x{{{i:X}}}" for i in _digits()[value]) + "]"


def other_digit() -> str:
    """An RE2 pattern of text holding a digit of another script than ASCII's."""
    codes = sorted(i for codes in _digits().values() for i in codes if i > 127)
    return "(?s).*[" + "".join(f"\\x{{{i:X}}}" for i in codes) + "].*"


def spelled_number(text: str) -> str:
    """An RE2 pattern of every decimal spelling float() reads as the number `text` (positional, as
    '-12.5'), in any script's digits: leading and trailing zeros, a '+', spaces around, a zero exponent."""
    negative, text = text.startswith("-"), text.lstrip("-")
    whole, _, fraction = text.partition(".")
    zeros = digit_class(0) + "*"
    digits = lambda part: "".join(digit_class(int(d)) for d in part)  # noqa: E731
    whole = zeros + (digits(whole) if whole.strip("0") else "")
    if fraction:
        body = f"{whole}\\.{digits(fraction)}{zeros}"
    elif text.strip("0"):
        body = f"{whole}(?:\\.{zeros})?"
    else:
        body = f"(?:{digit_class(0)}+(?:\\.{zeros})?|\\.{digit_class(0)}+)"
    sign = "-" if negative else "[+-]?" if not text.strip("0.") else "\\+?"
    return f"{SPACE}{sign}{body}(?:[eE][+-]?{digit_class(0)}+)?{SPACE}"


def _positional(value: float, dtype: Any) -> str:
    return np.format_float_positional(dtype(value), trim="-")


def _as_value(g: Graph, cells: str, to: int) -> str:
    """Text cells as numbers (`to`: the ONNX type); NaN for a cell that is no number, or one beyond a
    double (onnxruntime's Cast would stop the graph)."""
    number = g.op("RegexFullMatch", cells, pattern=NUMBER)
    return g.op("Cast", g.op("Where", number, cells, g.const([["nan"]], "nan", None)), to=to)


def _equals_any(g: Graph, values: str, numbers: tuple[float, ...], dtype: Any) -> str:
    hit = None
    for number in numbers:
        equal = g.op("Equal", values, g.const(number, "token", dtype))
        hit = equal if hit is None else g.op("Or", hit, equal)
    return hit


def _matches(g: Graph, cells: str, words: Any, fold_case: bool = False) -> str:
    """(N, 1) bool: the cell, without the whitespace around it (as `predict` strips it), is one of
    `words` (lower case, matched in any case where `fold_case`)."""
    either = "|".join(_literal(str(w)) for w in words)
    return g.op("RegexFullMatch", cells, pattern=f"{'(?i)' * fold_case}{SPACE}(?:{either}){SPACE}")


def _literal(text: str) -> str:
    """`text` as an RE2 pattern that matches exactly it: every character but ASCII letters and
    digits spelled by its code point."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def boolean(g: Graph, cells: str) -> str:
    """1 for a true word, 0 for a false one, NaN for a cell that is neither (predict refuses it; the
    graph cannot, so the row gets no answer rather than a wrong one)."""
    one, zero = g.const([[1.0]], "true"), g.const([[0.0]], "false")
    neither = g.op("Where", _matches(g, cells, FALSE, fold_case=True), zero, g.const([[float("nan")]], "nan"))
    return g.op("Where", _matches(g, cells, TRUE, fold_case=True), one, neither)


def one_hot(g: Graph, cells: str, categories: list[str]) -> str:
    """The category's one-hot row; an unseen category is all zeros, as `predict` encodes it by default.
    Categories that are numbers are compared as numbers (the cell '1.0' is the category '1', as the
    readers spell codes; a cell that is no number matches none); the others by their text."""
    numbers_at = [i for i, c in enumerate(categories) if _as_number(c) is not None]
    words_at = [i for i in range(len(categories)) if i not in set(numbers_at)]
    parts = []
    if numbers_at:
        parts.append(_code_one_hot(g, cells, [_as_number(categories[i]) for i in numbers_at]))
    if words_at:
        parts.append(_text_one_hot(g, cells, [categories[i] for i in words_at]))
    if len(parts) == 1:
        return parts[0]
    order = np.argsort(numbers_at + words_at)  # the concatenated columns back in the categories' order
    return g.op("Gather", g.op("Concat", *parts, axis=1), g.const(order.astype(np.int64), "order", np.int64), axis=1)


def _code_one_hot(g: Graph, cells: str, codes: list[float]) -> str:
    """One-hot rows of number codes: cells read as numbers (float32, as `predict` reads codes); where a
    cell holds another script's digits ('٢'), each code's spellings matched by RE2 as well."""
    float_ = g.onnx.TensorProto.FLOAT
    hot = g.op("Cast", g.op("Equal", _as_value(g, cells, float_), g.const([codes], "categories")), to=float_)
    other = g.op("RegexFullMatch", cells, pattern=other_digit())
    count = g.op("ReduceSum", g.op("Cast", other, to=g.onnx.TensorProto.INT64), keepdims=0)
    spelled = g.branch(lambda: g.op("Max", hot, g.op("Cast", g.op("Concat", *(
        g.op("RegexFullMatch", cells, pattern=spelled_number(_positional(c, np.float32))) for c in codes), axis=1),
        to=float_)), "spelled")
    plain = g.branch(lambda: g.op("Identity", hot), "plain")
    return g.op("If", g.op("Greater", count, g.const(0, "zero", np.int64)), then_branch=spelled, else_branch=plain)


def _text_one_hot(g: Graph, cells: str, categories: list[str]) -> str:
    """One-hot rows of categories compared by text (a cell with whitespace around it stripped first)."""
    float_ = g.onnx.TensorProto.FLOAT
    padded = g.op("RegexFullMatch", cells, pattern=f"(?s)(?:{SPACE_CHAR}.*|.*{SPACE_CHAR})")
    count = g.op("ReduceSum", g.op("Cast", padded, to=g.onnx.TensorProto.INT64), keepdims=0)
    stripped = g.branch(lambda: g.op("Cast", g.op("Concat", *(_matches(g, cells, [c]) for c in categories), axis=1),
                                     to=float_), "stripped")
    exact = g.branch(lambda: _exact_one_hot(g, cells, categories), "exact")
    return g.op("If", g.op("Greater", count, g.const(0, "zero", np.int64)), then_branch=stripped, else_branch=exact)


def _exact_one_hot(g: Graph, cells: str, categories: list[str]) -> str:
    """The one-hot rows of cells that hold no whitespace around them: one CategoryMapper lookup (a
    RegexFullMatch per category, needed only where a cell must be stripped, is 6x slower at 1,500)."""
    codes = g.op("CategoryMapper", cells, domain="ai.onnx.ml", cats_strings=[str(c) for c in categories],
                 cats_int64s=list(range(len(categories))), default_int64=-1)
    hot = g.op("Equal", codes, g.const([list(range(len(categories)))], "codes", np.int64))
    return g.op("Cast", hot, to=g.onnx.TensorProto.FLOAT)


def _as_number(category: str) -> float | None:
    try:
        value = float(category)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def category_code(g: Graph, hot: str, categories: int) -> str:
    """An embedded column's category code from its one-hot row: sum(k * hot_k) + sum(hot) - 1 (-1:
    unseen, as `predict` encodes it)."""
    ranks = g.const(np.arange(categories, dtype=np.float32).reshape(-1, 1), "ranks")
    hits = g.op("ReduceSum", hot, g.const([1], "axis", np.int64), keepdims=1)
    return g.op("Sub", g.op("Add", g.op("MatMul", hot, ranks), hits), g.const(np.float32(1.0), "one"))


def date_parts(g: Graph, column: Any) -> str:
    """A date column from a float64 input of seconds since 1970-01-01 (wall-clock time as written, its
    UTC offset dropped, as `dates.parse` reads a cell; NaN missing):
    year, month, day, weekday, day of year (and hour), by Hinnant's days-to-civil arithmetic."""
    cells = g.input(column.name, g.onnx.TensorProto.DOUBLE, DATE_INPUT)
    c = lambda value: g.const(float(value), "k", np.float64)  # noqa: E731
    floor_div = lambda a, b: g.op("Floor", g.op("Div", a, c(b)))  # noqa: E731
    missing = g.op("IsNaN", cells)
    fill = (dates.seconds(np.array([str(column.fill)]), column.date_format))[0]
    secs = g.op("Where", missing, c(fill), cells)
    days = floor_div(secs, dates.DAY)
    era = floor_div(g.op("Add", days, c(719468)), 146097)
    doe = g.op("Sub", g.op("Add", days, c(719468)), g.op("Mul", era, c(146097)))
    yoe = floor_div(g.op("Add", g.op("Sub", g.op("Sub", doe, floor_div(doe, 1460)), floor_div(doe, 146096)),
                         floor_div(doe, 36524)), 365)
    doy = g.op("Sub", doe, g.op("Sub", g.op("Add", g.op("Mul", yoe, c(365)), floor_div(yoe, 4)), floor_div(yoe, 100)))
    mp = floor_div(g.op("Add", g.op("Mul", doy, c(5)), c(2)), 153)
    day = g.op("Add", g.op("Sub", doy, floor_div(g.op("Add", g.op("Mul", mp, c(153)), c(2)), 5)), c(1))
    march_on = g.op("Less", mp, c(10))
    month = g.op("Where", march_on, g.op("Add", mp, c(3)), g.op("Sub", mp, c(9)))
    year = g.op("Add", g.op("Add", yoe, g.op("Mul", era, c(400))), g.op("Cast", g.op("Not", march_on),
                                                                          to=g.onnx.TensorProto.DOUBLE))
    shifted = g.op("Add", days, c(3))
    weekday = g.op("Sub", shifted, g.op("Mul", floor_div(shifted, 7), c(7)))
    # day of the year: days since this year's March 1 (doy), from January 1 (59 days before, 60 in a leap year)
    leap = g.op("Sub", g.op("Add", g.op("Sub", floor_div(year, 4), floor_div(year, 100)), floor_div(year, 400)),
                g.op("Add", g.op("Sub", floor_div(g.op("Sub", year, c(1)), 4), floor_div(g.op("Sub", year, c(1)), 100)),
                     floor_div(g.op("Sub", year, c(1)), 400)))
    yearday = g.op("Where", march_on, g.op("Add", g.op("Add", doy, c(60)), leap), g.op("Sub", doy, c(305)))
    parts = [year, month, day, weekday, yearday]
    if column.time_of_day:
        parts.append(g.op("Div", g.op("Sub", secs, g.op("Mul", days, c(dates.DAY))), c(3600)))
    if column.indicator:
        parts.append(g.op("Cast", missing, to=g.onnx.TensorProto.DOUBLE))
    return g.op("Cast", g.op("Concat", *parts, axis=1), to=g.onnx.TensorProto.FLOAT)
