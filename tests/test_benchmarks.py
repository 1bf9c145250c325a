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


def test_the_big_data_benchmarks_bounded_epoch_takes_what_the_builder_passes(monkeypatch):
    """benchmarks/big_data.py replaces the builder's prepare_streamed to bound its epochs: the stand-in
    takes every argument the original takes (a new keyword broke the 10 GB run, after the fitting)."""
    import importlib.util
    import inspect
    from magmadnn_cli.data import stream_prepare
    from magmadnn_cli.training import builder
    spec = importlib.util.spec_from_file_location("big_data", ROOT / "benchmarks" / "big_data.py")
    big_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(big_data)
    monkeypatch.setattr(builder, "prepare_streamed", builder.prepare_streamed)  # put back after the test
    big_data.bound_epoch(1)
    assert builder.prepare_streamed is not stream_prepare.prepare_streamed
    wanted = inspect.signature(stream_prepare.prepare_streamed).parameters
    inspect.signature(builder.prepare_streamed).bind(**{name: None for name in wanted})
