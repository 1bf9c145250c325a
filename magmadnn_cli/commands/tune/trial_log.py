"""The search's journal, `<search dir>/trials.jsonl`: a header line (the base config, seed included),
then one JSON line per finished trial, each flushed and fsynced as it lands. A search killed at any
point keeps every finished trial; `magmadnn tune --resume` reads them back and runs only the rest."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ...training.checkpoint import differences
from ...errors import MagmaError
from ...files import cannot_write
from ...training.run_folder import RunFolder

# Config fields a resumed search may change: they do not change what any trial computes.
MAY_CHANGE = ("name", "device", "memory", "distributed", "search.stop_when")


class TrialLog:
    def __init__(self, folder: Path, base: dict[str, Any], resume: bool) -> None:
        """Start a new journal, or (resume) check that the base config matches the journal's and load
        its finished trials into `done`."""
        self.path = RunFolder(folder).journal
        self.done: list[dict[str, Any]] = []
        if resume:
            saved, self.done = read(self.path)
            changed = [d for d in differences(saved, base, None, "search") if not d.startswith(MAY_CHANGE)]
            if changed:
                raise MagmaError(f"tune --resume: the config differs from the search in {self.path}, so its "
                                 "trials would not compare:\n  " + "\n  ".join(changed))
            return
        self._write("w", {"base": base})

    def append(self, result: dict[str, Any]) -> None:
        self._write("a", result)

    def _write(self, mode: str, record: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, mode, encoding="utf-8") as f:
                f.write(json.dumps(record, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise cannot_write(self.path, exc) from exc


def read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The journal's base config and finished trials (a line cut short by a kill is ignored)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise MagmaError(f"tune --resume: {path} not found (a search writes it as trials finish; "
                         "give the search's --out)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MagmaError(f"tune --resume: cannot read {path}: {exc}") from exc
    try:
        base = json.loads(lines[0])["base"]
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise MagmaError(f"tune --resume: {path} is not a search journal (no header line)") from exc
    done = []
    for line in lines[1:]:
        try:
            done.append(json.loads(line))
        except ValueError:
            continue  # the last line, if the writer was killed mid-line
    return base, done


def saved_seed(folder: Path) -> int | None:
    """The seed the journal's search ran with (for a config that leaves `seed` out)."""
    return read(RunFolder(folder).journal)[0].get("seed")


def resume_command(out_dir: Path) -> str:
    """The command that continues this search: the one that started it, with --out and --resume."""
    args = sys.argv[1:] if sys.argv[1:2] == ["tune"] else ["tune", "CONFIG"]
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--out", "-o"):
            skip = True
        elif arg not in ("--resume", "--overwrite") and not arg.startswith("--out="):
            kept.append(arg)
    return shlex.join(["magmadnn", *kept, "--out", str(out_dir), "--resume"])
