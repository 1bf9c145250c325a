"""Date columns: ISO 8601 dates and date-times (`2024-03-15`, `2024-03-15T14:30:00`, with a space, seconds
fractions or a UTC offset), or cells in `data.date_format` (strptime codes, e.g. `%d/%m/%Y`), as
numeric features: year, month, day, weekday (Monday 0), day of the year and, when the training cells
hold times, the hour of the day (wall-clock time as written). Cells are parsed once per distinct value."""

from __future__ import annotations

import re
from datetime import datetime

import numpy as np

ISO = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?)?(Z|[+-]\d{2}(:?\d{2})?)?")
PARTS = ("year", "month", "day", "weekday", "yearday")
EPOCH = datetime(1970, 1, 1)
DAY = 86400.0


def parse(text: str, date_format: str = "") -> datetime | None:
    """The wall-clock date-time a cell holds, or None when it holds none in this format."""
    text = text.strip()
    try:
        if date_format:
            return datetime.strptime(text, date_format).replace(tzinfo=None)
        if not ISO.fullmatch(text):
            return None
        return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text).replace(tzinfo=None)
    except ValueError:
        return None


def seconds(cells: np.ndarray, date_format: str = "") -> np.ndarray:
    """Each cell as seconds since 1970-01-01 (wall-clock time); NaN where it is no date."""
    uniques, inverse = np.unique(cells.astype(str), return_inverse=True)
    parsed = [parse(u, date_format) for u in uniques.tolist()]
    values = np.array([(p - EPOCH).total_seconds() if p is not None else np.nan for p in parsed], dtype=np.float64)
    return values[inverse.ravel()]


def all_dates(values: np.ndarray, date_format: str = "") -> bool:
    """Every one of these (distinct, present) cells is a date: the column is typed date."""
    return len(values) > 0 and not np.isnan(seconds(values, date_format)).any()


def has_time(values: np.ndarray) -> bool:
    """Some of these seconds fall after midnight: the time of day is a feature."""
    present = values[~np.isnan(values)]
    return bool((present % DAY != 0).any())


def features(values: np.ndarray, time_of_day: bool, dtype: np.dtype) -> np.ndarray:
    """(N, 5 or 6) year, month, day, weekday, day of year (and hour of day) from seconds (no NaN)."""
    days = np.floor(values / DAY)
    dates = days.astype("datetime64[D]")
    months = dates.astype("datetime64[M]")
    years = dates.astype("datetime64[Y]")
    columns = [years.astype(np.int64) + 1970, months.astype(np.int64) % 12 + 1, (dates - months).astype(np.int64) + 1,
               (days.astype(np.int64) + 3) % 7, (dates - years).astype(np.int64) + 1]
    if time_of_day:
        columns.append((values - days * DAY) / 3600.0)
    return np.stack(columns, axis=1).astype(dtype)


def iso(value: float) -> str:
    """Seconds since 1970 as ISO text (the date alone at midnight)."""
    moment = np.datetime64(int(round(value)), "s")
    return str(moment.astype("datetime64[D]")) if value % DAY == 0 else str(moment)


# common non-ISO spellings (not %d.%m.%y: version numbers such as 1.2.3 read so)
FORMATS = ("%m/%d/%Y", "%d/%m/%Y", "%d.%m.%Y", "%Y/%m/%d", "%d-%m-%Y", "%m-%d-%Y", "%m/%d/%y", "%d/%m/%y",
           "%d %b %Y", "%b %d %Y", "%b %d, %Y", "%m/%d/%Y %H:%M", "%d/%m/%Y %H:%M",
           "%m/%d/%Y %H:%M:%S", "%d/%m/%Y %H:%M:%S", "%Y/%m/%d %H:%M:%S")


def formats_of(values: np.ndarray) -> list[str]:
    """The common date formats in which every one of these distinct text values is a date: the
    data.date_format candidates for a column that is not ISO 8601."""
    return [f for f in FORMATS if all(parse(str(v), f) is not None for v in values)] if len(values) else []


def only_format(values: np.ndarray, sample: int = 200) -> str | None:
    """The one common format every one of these distinct text values is a date in (candidates found on
    `sample` values spread over them, the one left checked on all); None where none or several read
    them (01/02/2012: January 2 or February 1 is not guessed)."""
    if not len(values):
        return None
    candidates = formats_of(values[::max(1, -(-len(values) // sample))])
    return candidates[0] if len(candidates) == 1 and all_dates(values, candidates[0]) else None
