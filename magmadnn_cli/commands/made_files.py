"""The files commands write into a run folder beside its outputs (export's model.onnx, plot's PNGs),
recorded by their content's sha256 in the folder's `.magmadnn-made`, so that a later run or plot
replaces or removes those only: never a file a person put there, or changed since."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..files import file_sha256, json_object, write_json
from .run_dir import MARKER

LEDGER = ".magmadnn-made"


def record(path: Path, data: bytes) -> None:
    """`path`, just written with `data`, is magmadnn's: noted where its folder is a run folder (a
    file written anywhere else leaves no ledger behind)."""
    folder = path.parent
    if not (folder / MARKER).is_file():
        return
    write_json(folder / LEDGER, {**_ledger(folder), path.name: hashlib.sha256(data).hexdigest()})


def is_made(path: Path) -> bool:
    """Whether `path` holds what magmadnn wrote there (False for a file a person made or changed)."""
    digest = _ledger(path.parent).get(path.name)
    return digest is not None and file_sha256(path) == digest


def remove_made(path: Path) -> bool:
    """Remove `path` if magmadnn made it; returns whether a file of a person's stays there."""
    if not path.is_file():
        return False
    if is_made(path):
        path.unlink()
        return False
    return True


def _ledger(folder: Path) -> dict[str, str]:
    return {k: v for k, v in json_object(folder / LEDGER).items() if isinstance(v, str)}
