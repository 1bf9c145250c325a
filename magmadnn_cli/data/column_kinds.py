"""Each encoded column kind's runtime, declared once (`config/column_kinds.py` holds its facts): the
rule that infers it from a column's text cells, the value that fills its missing cells, its encoding
and its ONNX form. `FORMS` holds one of each, by kind; `Column.form` reaches its own."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..config.column_kinds import ColumnKindDecl, kind_named
from ..core.registry import Registered
from ..errors import DataError
from . import dates
from .cells import FALSE, TRUE, MissingTokens, RawColumns, booleans_in, canonical, dates_in, is_missing, is_number, \
    numbers_in, said_as_written, shortest, spellings
from .onnx_cells import boolean, category_code, date_parts, number_tokens, one_hot, text_missing

if TYPE_CHECKING:
    from .columns import Column

MISSING_CATEGORY = "(missing)"  # auto's fill of a category column with missing training cells


@dataclass(frozen=True)
class Encoding:
    """What encoding a column's cells needs beside them: the dtype, the file named in messages, what
    refuses an unseen category (None: encoded as all zeros) and whether the model is a saved one (its
    bad cells can only be fixed, not retyped)."""
    dtype: Any
    source: str
    refusal: str | None = None
    saved: bool = False


@dataclass(frozen=True)
class Training:
    """A column's training cells as fitting reads them: the rows, its position, its missing cells,
    the file named in messages and its median (numbers read as such, computed for all at once)."""
    raw: RawColumns
    j: int
    missing: np.ndarray
    source: str
    median: float = 0.0

    def present(self) -> np.ndarray:
        return self.raw.cells(self.j)[~self.missing]


class ColumnForm(Registered):
    """One encoded column kind. `infers` is its inference rule (None: not this kind; else the date
    format it reads, '' for none); `fit` sets the column's fill (and what else it learns from the
    training rows); `encode` gives the column's block and its unseen categories; `onnx` the same block
    from the exported graph's input."""
    implementations: ClassVar[dict[str, type]] = {}
    declaration: ClassVar[ColumnKindDecl]
    median_name: ClassVar[str] = "median"

    def values(self, column: Column) -> list[str]:
        """The names of the columns its values encode into (before a missing indicator)."""
        return [column.name]

    def infers(self, values: np.ndarray, date_format: str) -> str | None:
        return None

    def fit(self, column: Column, cells: Training, strategy: str, constant: Any) -> None:
        if strategy == "constant":
            column.fill = shortest(str(constant))
        elif strategy in ("mean", "median"):
            raise DataError(f"data.columns.{column.name}: missing: {strategy} needs numbers; the column is a "
                            f"{column.kind}: use most_frequent or constant")
        else:
            column.fill = self.most_frequent(column, cells, strategy)

    def most_frequent(self, column: Column, cells: Training, strategy: str) -> Any:
        counts = Counter(canonical(cells.present()).tolist())
        return min(counts, key=lambda c: (-counts[c], c)) if counts else "missing"

    def encode(self, column: Column, raw: RawColumns, j: int, how: Encoding) -> tuple[np.ndarray, Counter]:
        raise NotImplementedError

    def onnx(self, g: Any, column: Column, tokens: MissingTokens) -> str:
        """The column's block (with its missing indicator) in the graph, from its own text input."""
        cells = g.input(column.name, g.onnx.TensorProto.STRING, "the cell's text")
        missing = text_missing(g, cells, tokens)
        filled = g.op("Where", missing, g.const([[str(column.fill)]], "fill", None), cells)
        return _onnx_indicator(g, self.onnx_block(g, column, filled), missing, column.indicator)

    def onnx_block(self, g: Any, column: Column, filled: str) -> str:
        raise NotImplementedError

    def held(self, column: Column, cells: np.ndarray) -> str:
        """What the run log says an inferred column of this kind holds."""
        return ""


class NumberForm(ColumnForm):
    declaration = kind_named("number")

    def fit(self, column: Column, cells: Training, strategy: str, constant: Any) -> None:
        if strategy == "constant":
            if not is_number(str(constant)):
                raise DataError(f"data.columns.{column.name}.fill_value: {constant!r} is not a number (the column "
                                "is typed number)")
            column.fill = float(constant)
            return
        if strategy in ("auto", "median") and cells.j not in cells.raw.text:
            column.fill = cells.median  # computed for every such column in one pass
            return
        raw, j = cells.raw, cells.j
        values = raw.x[:, j] if j not in raw.text else numbers_in(raw, j, column.name, cells.source)
        present = values[~np.isnan(values)]
        if strategy == "mean" and present.size:
            column.fill = float(present.mean())
        elif strategy == "most_frequent" and present.size:
            uniques, counts = np.unique(present, return_counts=True)
            column.fill = float(uniques[counts.argmax()])
        else:
            column.fill = float(np.median(present)) if present.size else 0.0

    def encode(self, column: Column, raw: RawColumns, j: int, how: Encoding) -> tuple[np.ndarray, Counter]:
        values = raw.x[:, j] if j not in raw.text else numbers_in(raw, j, column.name, how.source, how.saved)
        missing = np.isnan(values)
        block = np.where(missing, np.dtype(how.dtype).type(column.fill), values)[:, None].astype(how.dtype, copy=False)
        return with_indicator(block, missing, column.indicator), Counter()

    def onnx(self, g: Any, column: Column, tokens: MissingTokens) -> str:
        values = number_tokens(g, g.input(column.name, g.onnx.TensorProto.FLOAT, "float32 (NaN: missing)"), tokens)
        missing = g.op("IsNaN", values)
        block = g.op("Where", missing, g.const([[float(column.fill)]], "fill"), values)
        return _onnx_indicator(g, block, missing, column.indicator)


class CategoryForm(ColumnForm):
    declaration = kind_named("category")

    def values(self, column: Column) -> list[str]:
        return [f"{column.name}#code"] if column.embedding else [f"{column.name}={c}" for c in column.categories]

    def fit(self, column: Column, cells: Training, strategy: str, constant: Any) -> None:
        super().fit(column, cells, strategy, constant)
        present = set(canonical(cells.present()).tolist())
        column.categories = sorted(present | ({str(column.fill)} if cells.missing.any() else set()))

    def most_frequent(self, column: Column, cells: Training, strategy: str) -> Any:
        if strategy == "auto" and cells.missing.any():  # a category of their own, named apart from the values
            counts = set(canonical(cells.present()).tolist())
            return next(name for k in range(1, len(counts) + 2)
                        if (name := MISSING_CATEGORY if k == 1 else f"(missing {k})") not in counts)
        return super().most_frequent(column, cells, strategy)

    def encode(self, column: Column, raw: RawColumns, j: int, how: Encoding) -> tuple[np.ndarray, Counter]:
        cells = raw.cells(j)
        missing = is_missing(cells)
        cells = np.where(missing, str(column.fill), canonical(cells))
        index = {c: i for i, c in enumerate(column.categories)}
        uniques, inverse, counts = np.unique(cells, return_inverse=True, return_counts=True)
        unique_codes = np.array([index.get(u, -1) for u in uniques], dtype=np.int64)
        codes = unique_codes[inverse.ravel()]
        unknown = Counter({str(u): int(n) for u, n, code in zip(uniques, counts, unique_codes) if code < 0})
        if unknown and how.refusal:
            row = raw.first(codes < 0)
            raise DataError(f"{how.source}: column {column.name!r}, data row {raw.row(row)}: category "
                            f"{str(cells[row])!r} was not in the training data (known: "
                            f"{', '.join(map(repr, column.categories[:12]))}); {how.refusal}")
        block = codes[:, None].astype(how.dtype) if column.embedding else \
            (codes[:, None] == np.arange(len(column.categories))[None, :]).astype(how.dtype)
        return with_indicator(block, missing, column.indicator), unknown

    def onnx_block(self, g: Any, column: Column, filled: str) -> str:
        hot = one_hot(g, filled, column.categories)
        return category_code(g, hot, len(column.categories)) if column.embedding else hot

    def held(self, column: Column, cells: np.ndarray) -> str:
        blanks = " and blanks" if own_missing_category(column) else ""
        return f", {len(present_categories(column))} values{blanks}"


class DateForm(ColumnForm):
    declaration = kind_named("date")
    median_name = "median date"

    def values(self, column: Column) -> list[str]:
        return [f"{column.name}.{part}" for part in dates.PARTS + ("hour",) * column.time_of_day]

    def infers(self, values: np.ndarray, date_format: str) -> str | None:
        if dates.all_dates(values, date_format):
            return date_format
        return (dates.only_format(values) or None) if not date_format else None

    def fit(self, column: Column, cells: Training, strategy: str, constant: Any) -> None:
        """The fill (the training dates' median, mean, most frequent or the constant), and whether the
        cells hold times of day."""
        raw, missing = cells.raw, cells.missing
        present = dates_in(cells.present(), raw.rows(np.flatnonzero(~missing)), column.name, column.date_format,
                           cells.source)
        column.time_of_day = dates.has_time(present)
        if strategy == "constant":
            if dates.parse(str(constant), column.date_format) is None:
                raise DataError(f"data.columns.{column.name}.fill_value: {constant!r} is not a date (the column "
                                "holds dates)")
            column.fill = str(constant)
            return
        if strategy == "most_frequent" and present.size:
            uniques, counts = np.unique(present, return_counts=True)
            column.fill = dates.iso(float(uniques[counts.argmax()]))
        else:
            middle = (present.mean() if strategy == "mean" else np.median(present)) if present.size else 0.0
            column.fill = dates.iso(float(middle))
        if column.date_format:  # the fill is parsed like a cell of the column
            column.fill = dates.EPOCH.fromisoformat(column.fill).strftime(column.date_format)

    def encode(self, column: Column, raw: RawColumns, j: int, how: Encoding) -> tuple[np.ndarray, Counter]:
        cells = raw.cells(j)
        missing = is_missing(cells)
        values = dates_in(np.where(missing, column.fill, cells), raw, column.name, column.date_format, how.source,
                          how.saved)
        block = dates.features(values, column.time_of_day, np.dtype(how.dtype))
        return with_indicator(block, missing, column.indicator), Counter()

    def onnx(self, g: Any, column: Column, tokens: MissingTokens) -> str:
        return date_parts(g, column)

    def held(self, column: Column, cells: np.ndarray) -> str:
        written = f", written {column.date_format!r}" if column.date_format else ""
        return f"{written}: {', '.join(self.values(column))}"


class BooleanForm(ColumnForm):
    declaration = kind_named("boolean")

    def infers(self, values: np.ndarray, date_format: str) -> str | None:
        words = np.char.lower(np.char.strip(values.astype(str)))
        return "" if len(values) and np.isin(words, TRUE + FALSE).all() else None

    def most_frequent(self, column: Column, cells: Training, strategy: str) -> Any:
        """The more frequent side, in its most frequent spelling."""
        text = cells.raw.cells(cells.j)
        flags = booleans_in(np.where(cells.missing, "false", text), cells.raw, column.name, cells.source)[~cells.missing]
        true, false = spellings(text)
        return (true or ["true"])[0] if flags.sum() * 2 >= len(flags) and len(flags) else (false or ["false"])[0]

    def encode(self, column: Column, raw: RawColumns, j: int, how: Encoding) -> tuple[np.ndarray, Counter]:
        cells = raw.cells(j)
        missing = is_missing(cells)
        flags = booleans_in(np.where(missing, str(column.fill), cells), raw, column.name, how.source, how.saved)
        return with_indicator(flags[:, None].astype(how.dtype), missing, column.indicator), Counter()

    def onnx_block(self, g: Any, column: Column, filled: str) -> str:
        return boolean(g, filled)

    def held(self, column: Column, cells: np.ndarray) -> str:
        return f": {said_as_written(cells)}"


class ConstantForm(ColumnForm):
    """A column with one value in every training row: nothing to learn from, left out."""
    declaration = kind_named("constant")

    def values(self, column: Column) -> list[str]:
        return []

    def encode(self, column: Column, raw: RawColumns, j: int, how: Encoding) -> tuple[np.ndarray, Counter]:
        return np.zeros((len(raw.x), 0), how.dtype), Counter()


def present_categories(column: Column) -> list[str]:
    """A category column's values as the training cells hold them (its missing category left out)."""
    own = own_missing_category(column)
    return [c for c in column.categories if not (own and c == column.fill)]


def own_missing_category(column: Column) -> bool:
    """Whether a category column's fill is auto's category for missing cells ('(missing)', or
    '(missing 2)' where the data holds a '(missing)')."""
    return column.kind == "category" and re.fullmatch(r"\(missing( \d+)?\)", str(column.fill)) is not None


def with_indicator(block: np.ndarray, missing: np.ndarray, indicator: bool) -> np.ndarray:
    return np.concatenate([block, missing[:, None].astype(block.dtype)], axis=1) if indicator else block


def _onnx_indicator(g: Any, block: str, missing: str, indicator: bool) -> str:
    return g.op("Concat", block, g.op("Cast", missing, to=g.onnx.TensorProto.FLOAT), axis=1) if indicator else block


FORMS: dict[str, ColumnForm] = {name: cls() for name, cls in ColumnForm.implementations.items()}
INFERRED: tuple[ColumnForm, ...] = tuple(f for f in FORMS.values() if type(f).infers is not ColumnForm.infers)
# the kinds with an inference rule, tried in the order they are defined above (dates, then booleans)
