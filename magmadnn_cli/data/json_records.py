"""A `.json` data file: JSON Lines (one record a line) is read; a JSON array of records, as
`json.dump(records)` and pandas' `to_json(orient='records')` write it, is named with its conversion."""

from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import DataError


def _first_character(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")[:1].decode("ascii", "replace")
    except OSError:
        return ""


def json_refusal(path: Path) -> DataError:
    """What a .json file is, and how to make it the JSON Lines file magmadnn reads."""
    lines = path.with_suffix(".jsonl")
    convert = (f"python -c \"import json, sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))]\" "
               f"{shlex.quote(str(path))} > {shlex.quote(str(lines))}")
    if _first_character(path) == "[":
        return DataError(f"{path}: a JSON array of records; magmadnn reads JSON Lines (one record a line, "
                         f".jsonl). Convert it: {convert} (or: jq -c '.[]' {shlex.quote(str(path))} > "
                         f"{shlex.quote(str(lines))}; pandas: df.to_json('{lines.name}', orient='records', "
                         "lines=True)), then give the .jsonl")
    return DataError(f"{path}: a .json file; magmadnn reads JSON Lines, one record (a JSON object) a line: if "
                     f"this file is written so, name it {lines.name}; if it holds an array of records, convert it: "
                     f"{convert}")
