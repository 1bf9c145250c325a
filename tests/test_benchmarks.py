"""The benchmarks use the package's names as they are: a refactoring that renames one (as the strategy
registry did to `data_parallel`) breaks this test, not a benchmark run months later."""

from __future__ import annotations

import ast
import importlib

import pytest

from conftest import ROOT

SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _imports(path):
    """(module, name) for every `from magmadnn_cli... import name` in the script, at any depth."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("magmadnn_cli"):
            yield from ((node.module, alias.name) for alias in node.names)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_name_a_benchmark_imports_exists(script):
    for module, name in _imports(script):
        loaded = importlib.import_module(module)
        if not hasattr(loaded, name):
            importlib.import_module(f"{module}.{name}")  # a submodule, or ModuleNotFoundError names it
