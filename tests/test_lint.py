"""The linter CI runs: ruff with the project's rules (pyproject.toml's [tool.ruff]), so every `noqa`
names a rule that is on and would fire (RUF100), and real mistakes (pyflakes) fail the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT


def test_ruff_passes():
    pytest.importorskip("ruff", reason="ruff comes with the test extra (make test installs it)")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
