"""The README's terminal examples cannot drift: every `$ command` shown in it runs (in a scratch folder
holding the project's configs and data), in order, and its exit status and shown output must match
what it prints. `...` in a shown output stands for any lines; a trailing `  # comment` is the README's
own; times are masked; so is the step a Ctrl-C lands on (the example interrupting a run sends SIGINT
once the epoch before the shown one has been printed)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow
COMMENT = re.compile(r"\s{2,}#.*$")
VOLATILE = [(re.compile(r"\b\d+(\.\d+)? ?(ms|s)\b"), "<time>"), (re.compile(r"step ?\d+"), "step<n>")]
INTERRUPTED = re.compile(r"interrupted: stopped by SIGINT at epoch (\d+)")


@dataclass
class Example:
    line: int            # the command's line in README.md
    command: str
    shown: list[str]     # its output as shown


def examples(text: str) -> list[Example]:
    """Each `$ ` line of a fenced block, with the lines after it up to the next `$ ` or the fence."""
    found: list[Example] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            current = None
        elif fenced and line.startswith("$ "):
            current = Example(number, COMMENT.sub("", line[2:]).strip(), [])
            found.append(current)
        elif fenced and current is not None:
            current.shown.append(COMMENT.sub("", line))
    for example in found:
        while example.shown and not example.shown[-1].strip():
            example.shown.pop()
    return [e for e in found if not e.command.startswith("source ")]  # the venv's bin is on PATH here


def normal(line: str) -> str:
    for pattern, mask in VOLATILE:
        line = pattern.sub(mask, line)
    return " ".join(line.split())


def matches(shown: list[str], actual: list[str]) -> bool:
    """Shown lines against printed ones, in order; `...` matches any run of lines (none included)."""
    if not shown:
        return not actual
    if shown[0].strip() == "...":
        return any(matches(shown[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and normal(shown[0]) == normal(actual[0]) and matches(shown[1:], actual[1:])


def run(example: Example, cwd: Path) -> tuple[int, list[str]]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "120"}
    proc = subprocess.Popen(["bash", "-c", example.command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    interrupt = next((int(m.group(1)) for s in example.shown if (m := INTERRUPTED.search(s))), None)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if interrupt is not None and line.startswith(f"epoch {interrupt - 1} "):
            proc.send_signal(signal.SIGINT)  # the next epoch starts before the signal is seen
    return proc.wait(timeout=600), lines


def expected_status(example: Example) -> int:
    first = next((s for s in example.shown if s.strip() and s.strip() != "..."), "")
    return 2 if first.startswith("error:") else 130 if first.startswith("interrupted:") else 0


def test_the_readme_shows_commands():
    shown = examples((ROOT / "README.md").read_text())
    assert len(shown) >= 8 and sum(bool(e.shown) for e in shown) >= 4


def test_every_readme_example_prints_what_the_readme_shows(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "datasets").symlink_to(ROOT / "datasets")
    for example in examples((ROOT / "README.md").read_text()):
        code, printed = run(example, tmp_path)
        where = f"README.md:{example.line}: {example.command}\nprinted:\n" + "\n".join(printed)
        assert code == expected_status(example), where
        if example.shown:
            assert matches(example.shown, printed), where
