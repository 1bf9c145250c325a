"""What a file is by its name alone, for messages about a path given in the wrong place (a data file
where a config or a model was expected); numpy-free, as all of config/ is."""

from __future__ import annotations

import re
from pathlib import Path

DATA_NAME = re.compile(r"(?i).*\.(csv|tsv|txt|data|parquet|pq|feather|arrow|jsonl|ndjson)(\.(gz|bz2|xz))?")


def is_data_name(path: Path) -> bool:
    """Whether a file's name is a data file's (eu.csv, train.jsonl.gz; not eu.csv.yaml)."""
    return DATA_NAME.fullmatch(path.name) is not None
