"""The command that resumes an interrupted run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def resume_command(run_dir: Path, ranks: int = 1) -> str:
    """The command that continues this run: the one that started it, with `--resume RUN_DIR` (and
    `--processes N` for a data-parallel run, whatever launched it)."""
    args = sys.argv[1:]
    if not args or args[0] != "train":
        args = ["train", "CONFIG"]
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--resume", "-r", "--init-from", "--processes", "-n"):
            skip = True
        elif not arg.startswith(("--resume=", "--init-from=", "--processes=")):
            kept.append(arg)
    return shlex.join(["magmadnn", *kept, *(["--processes", str(ranks)] if ranks > 1 else []),
                       "--resume", str(run_dir)])
