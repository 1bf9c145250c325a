"""ONNX ops that read a raw cell as `predict` reads it: text matched without the whitespace around it
(Python's whole str.isspace set), missing words in any case (RE2 `RegexFullMatch`, opset 20), number
tokens by value, booleans, and categories one-hot (one CategoryMapper lookup unless a cell must be
stripped); codes compared as numbers within a double's range. Built on `onnx_graph.Graph`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.columns import FALSE, MISSING, TRUE, MissingTokens

if TYPE_CHECKING:
    from .onnx_graph import Graph

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
    around ignored), or a number equal to a number token ('-999.0' for -999)."""
    missing = _matches(g, cells, (*MISSING, *tokens.words), fold_case=True)
    if not tokens.numbers:
        return missing
    values = _as_value(g, cells, g.onnx.TensorProto.DOUBLE)
    return g.op("Or", missing, _equals_any(g, values, tokens.numbers, np.float64))


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
    float_ = g.onnx.TensorProto.FLOAT
    numbers_at = [i for i, c in enumerate(categories) if _as_number(c) is not None]
    words_at = [i for i in range(len(categories)) if i not in set(numbers_at)]
    parts = []
    if numbers_at:
        values = _as_value(g, cells, float_)
        codes = g.const([[_as_number(categories[i]) for i in numbers_at]], "categories")
        parts.append(g.op("Cast", g.op("Equal", values, codes), to=float_))
    if words_at:
        parts.append(_text_one_hot(g, cells, [categories[i] for i in words_at]))
    if len(parts) == 1:
        return parts[0]
    order = np.argsort(numbers_at + words_at)  # the concatenated columns back in the categories' order
    return g.op("Gather", g.op("Concat", *parts, axis=1), g.const(order.astype(np.int64), "order", np.int64), axis=1)


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
