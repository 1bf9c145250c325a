"""The folders show the architecture, and each outside library stays in its layer: cupy only in
core/, mpi4py only in distributed/, typer and rich only in the CLI and reporting."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT

PACKAGE = ROOT / "magmadnn_cli"
OWNERS = {"cupy": ("core/",), "mpi4py": ("distributed/",), "typer": ("cli.py",), "rich": ("cli.py", "reporting.py")}


def _imports(library: str) -> set[str]:
    pattern = re.compile(rf"^\s*(from|import)\s+{library}\b", re.M)
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text())}


@pytest.mark.parametrize("library", sorted(OWNERS))
def test_each_library_is_imported_only_by_its_layer(library):
    found = _imports(library)
    assert found, f"nothing imports {library}: the check would pass vacuously"
    strays = sorted(f for f in found if not f.startswith(OWNERS[library]))
    assert not strays, f"{library} imported outside {OWNERS[library]}: {strays}"


def test_the_folders_are_the_layers():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == ["commands", "config", "core", "data", "distributed", "nn", "training"]
    assert not (PACKAGE / "config" / "schema.py").read_text().count("import numpy")
