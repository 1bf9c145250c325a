"""The `data:` section of the config: files, splits, column types, missing values and scaling."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, PositiveInt, field_validator, model_validator

from .base import PositiveFloat, Strict, UnitFloat, problem_at
from .column_kinds import DECLARED, kinds_said
from .tasks import LABEL_SEPARATOR

ColumnKind = Literal[DECLARED]  # type: ignore[valid-type]  # the declared kinds, config/column_kinds.py
MissingStrategy = Literal["auto", "median", "mean", "most_frequent", "constant", "error"]


STRPTIME_CODES = "aAwdbBmyYHIpMSfzZjUWcxXGuV%"  # Python's strptime directives
CODES_SAID = ("%Y year, %y two-digit year, %m month, %b or %B month name, %d day, %j day of the year, %H hour, "
              "%I hour (12) with %p AM/PM, %M minute, %S second, %f microseconds, %z UTC offset, %a or %A weekday "
              "name, %% a percent sign")


def date_format_problem(text: str) -> str:
    """Why `text` is no strptime format ('' when it is one): an unknown code, a lone '%' at the end,
    or no code at all (a layout such as dd/mm/yyyy)."""
    codes = re.findall(r"%(.?)", text)
    unknown = [c for c in codes if c and c not in STRPTIME_CODES]
    if unknown:
        return f"'%{unknown[0]}' is no strptime code"
    if "" in codes:
        return "a lone '%' at the end"
    if not [c for c in codes if c != "%"]:
        return "it holds no % code"
    return ""


class SyntheticData(Strict):
    samples: PositiveInt = 1000
    features: PositiveInt = 20
    classes: Annotated[int, Field(ge=2)] = 3
    hidden: PositiveInt = 16
    noise: Annotated[float, Field(ge=0.0)] = 0.1


class ImageSettings(Strict):
    """How image files (a folder of class folders) are decoded: their size, colours and resizing."""
    size: list[PositiveInt] | None = Field(None, min_length=2, max_length=2, description="[height, width] every "
                                           "image is resized to (default: the size most of a sample of 64 images, "
                                           "spread over the files, have; the first image's where none is more common)")
    color: Literal["auto", "grayscale", "rgb", "rgba"] = Field(
        "auto", description="the channels: grayscale (1), rgb (3) or rgba (4); auto: the colours most of that sample "
                            "have, tied: the wider (an image's: grayscale for gray and 16-bit gray, rgba where it has "
                            "alpha or a transparent palette, else rgb)")
    resize: Literal["stretch", "crop", "pad"] = Field(
        "stretch", description="an image of another size: stretch to the size; crop (the centre, to the size's aspect "
                               "ratio) or pad (with black, to it), then resize")
    workers: PositiveInt | None = Field(None, description="processes decoding the files (default: every core)")
    on_error: Literal["error", "skip"] = Field(
        "error", description="a file that cannot be decoded: error (named, nothing trained) or skip (counted and "
                             "listed in the run log)")
    cache: bool = Field(True, description="keep the decoded pixels (uint8, memory-mapped) for later runs, keyed "
                        "by the files' names, sizes and times and these settings (a stale or damaged copy is decoded "
                        "again)")
    cache_dir: Path | None = Field(None, description="where the cache is kept (default: $XDG_CACHE_HOME/magmadnn/"
                                   "images, else ~/.cache/magmadnn/images); one per node is shared by its processes")


class ColumnSpec(Strict):
    """One feature column's type and missing-value handling (unset: inferred / data.missing_values)."""
    type: ColumnKind | None = Field(None, description=f"{kinds_said()}; default: inferred from the training rows")
    missing: MissingStrategy | None = Field(None, description="how missing cells are filled (default: "
                                            "data.missing_values)")
    fill_value: Union[float, str, None] = Field(None, description="the value for missing: constant")
    indicator: bool | None = Field(None, description="add a 0/1 column <name>_missing (default: "
                                   "data.missing_indicator)")
    embedding: PositiveInt | None = Field(None, description="a category column: learn a vector of this many values "
                                          "per category instead of a one-hot block (e.g. 8; Ludwig's default for "
                                          "categories), so a column of 10,000 values adds 8 inputs, not 10,000")

    @model_validator(mode="after")
    def _constant_needs_value(self) -> "ColumnSpec":
        if self.missing == "constant" and self.fill_value is None:
            raise ValueError("missing: constant needs a fill_value")
        if self.embedding is not None and self.type not in (None, "category"):
            raise ValueError(f"embedding is for category columns; this one is typed {self.type}: drop embedding, "
                             "or type it category")
        if self.embedding is not None:
            self.type = "category"
        return self


class DataConfig(Strict):
    train: Path | None = Field(None, description="CSV (with header), NPZ (arrays x, y), ... or a folder of class "
                               "folders of images (train/<class>/*.png); relative to the config file")
    target: Union[str, list[str], None] = Field(
        None, description="the column holding the class or value; or a list of 0/1 columns, one per label, for a "
                          "multi-label target (loss: binary_cross_entropy)")
    features: list[str] | None = Field(None, description="CSV feature columns (default: all but the target "
                                       "and the columns typed ignore)")
    names: list[str] | None = Field(None, min_length=1, description="the CSV has no header row: these are its "
                                    "column names, in order (e.g. UCI .data files)")
    columns: dict[str, Union[ColumnKind, ColumnSpec]] = Field(
        default_factory=dict, description=f"per column: a type ({', '.join(DECLARED)}) or "
                                          "{type, missing, fill_value, indicator, embedding}; the rest are inferred")
    missing_values: MissingStrategy = Field(
        "auto", description="missing cells (blank, NA, N/A, NaN, null, None, ?): auto = median for numbers, a "
                            "category of their own ('(missing)') for categories, most frequent for booleans; error "
                            "refuses them")
    missing_tokens: list[str] = Field(default_factory=list, description="more cell texts read as missing in "
                                      "every column and the target, compared without case and surrounding spaces, "
                                      "e.g. ['-', unknown] (pandas' na_values); stored with the model for predict")
    missing_indicator: bool = Field(False, description="add a 0/1 <name>_missing column for every column that "
                                    "has missing training cells")
    unseen_categories: Literal["ignore", "error"] = Field(
        "ignore", description="a category not seen in training: ignore = an all-zero one-hot (counted in a "
                              "warning); error = refuse the row")
    label_map: dict[Union[int, float, str], Union[int, float, str]] = Field(
        default_factory=dict, description="rename or merge target labels before training, e.g. {2: 1, 3: 1, 4: 1} "
                                          "or {no: 0, yes: 1} (keys match the labels as written in the data; a "
                                          "key that matches none is an error; unlisted labels stay); evaluate "
                                          "applies it too")
    validation: Path | None = None
    test: Path | None = None
    validation_split: UnitFloat = 0.1
    test_split: UnitFloat = 0.0
    stream: Union[bool, Literal["auto"]] = Field(
        False, description="read the training file in blocks each epoch instead of holding it in memory (a plain "
                           "CSV or a Parquet file, one process): true, false, or auto = stream when the file is "
                           "larger than half the memory available (README: Streamed epochs)")
    stratify: bool = Field(True, description="classification splits and folds keep each class's share")
    normalize: Literal["auto", "none", "minmax", "standard"] = Field(
        "auto", description="auto: tables' number columns standardized (mean 0, std 1 on the training rows, "
                            "stored in the model); images and features scaled by data.scale as read and scaled; "
                            "none | minmax | standard")
    target_normalize: Literal["auto", "standard", "none"] = Field(
        "auto", description="regression targets: auto = standard (fitted on training rows, stored; predictions "
                            "in the data's units)")
    scale: PositiveFloat | None = Field(None, description="multiply features by this first (e.g. 0.00392 = 1/255)")
    shape: list[PositiveInt] | None = Field(None, description="per-sample shape, e.g. [1, 28, 28] for image rows (C, H, W)")
    image: ImageSettings | None = Field(None, description="image files (data.train: a folder of class folders): "
                                        "{size: [H, W], color, resize, workers} (default: the size and colours "
                                        "most of the images have)")
    delimiter: Literal[",", ";", "\t", "|"] | None = Field(None, description="CSV field separator (default: sniffed; tab for .tsv)")
    decimal: Literal[".", ","] | None = Field(None, description="the decimal mark of CSV number cells (default: '.', or "
                                              "',' detected in a file not separated by commas whose numbers read "
                                              "only so, e.g. 3,5)")
    thousands: Literal[".", ",", " ", "'", "_", "\u00a0", "\u202f"] | None = Field(
        None, description="the thousands separator of CSV number cells, e.g. '.' with decimal ',' (1.234,5), or a "
                          "(no-break) space (\"\\u00a0\" in YAML); default none ('.' detected with a decimal comma)")
    date_format: str | None = Field(None, description="how date cells are written, in strptime codes, e.g. "
                                    "'%d/%m/%Y' (default: ISO 8601, 2024-03-15 or 2024-03-15T14:30)")
    encoding: str = Field("utf-8", description="CSV text encoding, e.g. latin-1 (a UTF-8 byte-order mark is skipped)")
    synthetic: SyntheticData | None = None

    @field_validator("missing_tokens", mode="before")
    @classmethod
    def _tokens_as_text(cls, value: Any) -> Any:
        """A number token as its text: YAML reads [-999, NA] as a number and a string."""
        if isinstance(value, list):
            if any(v is None or isinstance(v, bool) for v in value):
                raise ValueError("YAML reads yes, no, on, off, true, false and null as other things than words: "
                                 "quote them, e.g. ['no', 'null']")
            return [str(v) if isinstance(v, (int, float)) else v for v in value]
        return value

    @field_validator("date_format")
    @classmethod
    def _strptime_codes(cls, value: str | None) -> str | None:
        if value is not None and (problem := date_format_problem(value)):
            raise ValueError(f"{value!r} is not a date format: {problem}; write the cells' layout in strptime "
                             f"codes, e.g. '%d/%m/%Y' for 31/12/2024 or '%Y/%m/%d %H:%M' (the codes: {CODES_SAID})")
        return value

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        import codecs
        try:
            text = codecs.lookup(value)._is_text_encoding  # rot13 and base64 are codecs, not text encodings
        except LookupError:
            text = False
        if not text:
            raise ValueError(f"unknown text encoding {value!r} (e.g. utf-8, latin-1, cp1252)")
        return value

    @field_validator("names", "features")
    @classmethod
    def _names_unique(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            seen = {n for n in value if value.count(n) > 1}
            if seen:
                raise ValueError(f"duplicate column names: {', '.join(sorted(seen))}")
        return value

    @field_validator("target")
    @classmethod
    def _one_column_or_labels(cls, value: str | list[str] | None) -> str | list[str] | None:
        """A list of one column is that column; an empty one, or one naming a column twice, is refused."""
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("an empty list names no target column: give the column, or the 0/1 columns of a "
                             "multi-label target")
        twice = sorted({n for n in value if value.count(n) > 1})
        if twice:
            raise ValueError(f"the target lists {', '.join(map(repr, twice))} twice: name each label column once")
        joined = [n for n in value if LABEL_SEPARATOR in n]
        if len(value) > 1 and joined:
            raise ValueError(f"label column {joined[0]!r} holds {LABEL_SEPARATOR!r}, which separates labels: rename it")
        return value[0] if len(value) == 1 else value

    @property
    def target_columns(self) -> list[str]:
        """The target's columns: one, or a multi-label target's 0/1 columns (none for arrays)."""
        return [] if self.target is None else [self.target] if isinstance(self.target, str) else list(self.target)

    @property
    def label_columns(self) -> tuple[str, ...]:
        """A multi-label target's 0/1 columns, one per label (empty for a target of one column)."""
        return tuple(self.target) if isinstance(self.target, list) else ()

    @model_validator(mode="after")
    def _one_source(self) -> "DataConfig":
        both = [n for n in self.target_columns if n in (self.features or [])]
        if both:
            raise problem_at(self, ("features",), f"{both[0]!r} is the target; list only the input columns")
        if (self.train is None) == (self.synthetic is None):
            raise ValueError("give exactly one of data.train (a file) or data.synthetic")
        if self.validation_split + self.test_split >= 1.0:
            held = self.validation_split + self.test_split
            raise problem_at(self, ("test_split",) if self.test_split else ("validation_split",),
                             f"validation_split {self.validation_split:g} + test_split {self.test_split:g} = "
                             f"{held:g} holds out every row: keep their sum below 1 (e.g. 0.1 and 0.2)")
        if self.decimal is not None and self.decimal == self.thousands:
            raise problem_at(self, ("thousands",), f"decimal and thousands are both {self.decimal!r}; one mark "
                             "cannot be both")
        ignored = [n for n in self.features or [] if self.column_spec(n).type == "ignore"]
        if ignored:
            raise problem_at(self, ("features",), f"{ignored[0]!r} is listed in data.features and typed ignore in "
                             "data.columns: remove it from one of them")
        typed = [n for n in self.target_columns if n in self.columns]
        if typed:
            raise problem_at(self, ("columns", typed[0]), f"{typed[0]!r} is the target; column types are for "
                             "features")
        if self.label_columns and self.stream is True:
            raise problem_at(self, ("stream",), "a target of several 0/1 columns is not streamed yet: set data.stream: "
                             "false, or write the labels as one column of '|'-separated labels")
        return self

    def column_spec(self, name: str) -> ColumnSpec:
        spec = self.columns.get(name)
        return ColumnSpec(type=spec) if isinstance(spec, str) else (spec or ColumnSpec())
