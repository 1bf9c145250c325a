"""`python count_steps.py OUT.json magmadnn ARGS...`: run the CLI with the device stand-in as cupy, and
write to OUT.json (OUT.rank<r>.json under MPI) the reads and copies made inside training steps after
the first (forming the batches, the step, keeping its statistics)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cupy

from magmadnn_cli import cli
from magmadnn_cli.training.step_log import StepLog
from magmadnn_cli.training.trainer import Trainer

TALLIES: list = []


def _watched(fn):
    def inner(*args, **kwargs):
        with cupy.LEDGER.watch() as tally:
            result = fn(*args, **kwargs)
        TALLIES.append(tally)
        return result
    return inner


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    for owner, name in ((Trainer, "micro_batches"), (Trainer, "train_step"), (StepLog, "add")):
        setattr(owner, name, _watched(getattr(owner, name)))
    sys.argv = ["magmadnn", *argv]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    rank = os.environ.get("PMI_RANK")
    crossings = [f"{where} {kind}" for t in TALLIES[3:] for (where, kind) in (*t.reads, *t.copies)]
    target = out.with_suffix(f".rank{rank}.json") if rank is not None else out
    target.write_text(json.dumps({"code": code, "steps": len(TALLIES) // 3, "crossings": sorted(set(crossings))}))
    sys.exit(code)


if __name__ == "__main__":
    main()
