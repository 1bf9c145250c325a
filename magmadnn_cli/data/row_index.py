"""The row index R's `write.csv` and pandas' `to_csv` write as an unnamed first column (`""`, or
`Unnamed: 0` once pandas has read and written it back): the row numbers, not a feature. Left out of a
training table by default, and said; a config that names the column keeps it."""

from __future__ import annotations

import numpy as np

from ..config.data import DataConfig
from .table import Table

UNNAMED = ("", "Unnamed: 0")


def is_row_index(name: str, values: np.ndarray) -> bool:
    """An unnamed column of whole numbers that count the rows up, one by one, from 0 or 1 (rows left
    out of the file on the way, as after a filter, keep them rising)."""
    if name.strip() not in UNNAMED or len(values) < 2 or np.isnan(values).any():
        return False
    steps = np.diff(values)
    return bool(values[0] in (0.0, 1.0) and (values == np.round(values)).all() and (steps >= 1).all())


def without_row_index(table: Table, cfg: DataConfig) -> Table:
    """The table with an unnamed first column that holds the row numbers left out (and a note saying
    so), unless the config names it (data.features or data.columns)."""
    if table.x.ndim != 2 or len(table.features) < 2 or 0 in table.raw.text:
        return table
    name = table.features[0]
    if name in (cfg.features or ()) or name in cfg.columns or not is_row_index(name, table.raw.x[:, 0]):
        return table
    raw = table.raw
    low, high = raw.x[0, 0], raw.x[-1, 0]
    raw.x = raw.x[:, 1:]
    raw.text = {j - 1: cells for j, cells in raw.text.items()}
    table.features = table.features[1:]
    shown = "no name" if not name.strip() else f"the name {name!r}"
    table.notes.append(f"the first column has {shown} and holds the row numbers ({low:.0f} to {high:.0f}): a row "
                       f"index (as R's write.csv and pandas' to_csv write), left out of the inputs; to keep it, "
                       f"give it a type (data.columns: {{{name!r}: number}})")
    return table

