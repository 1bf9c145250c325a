"""One run folder object: every file of a run, a cross-validation and a search is named once, by
`RunFolder`, and every module asks it; one resolution of a folder to its model, its starting weights
and its checkpoint to resume; the run folder's modules import each other without a circle."""

from __future__ import annotations

import ast

import pytest

from conftest import ROOT

PACKAGE = ROOT / "magmadnn_cli"
HOME = PACKAGE / "training" / "run_folder"


def _names() -> dict[str, str]:
    """The file names RunFolder declares (its upper-case string attributes), as the test finds them."""
    from magmadnn_cli.training.run_folder import RunFolder
    found = {key: value for key, value in vars(RunFolder).items() if key.isupper() and isinstance(value, str)}
    assert len(found) >= 15, found  # model, metrics, history, config, checkpoints, journal, marker, lock, ...
    return found


# the same word for another thing: the suffix of magmadnn's TensorBoard event files (in a log folder
# anywhere), not a run folder's marker
OTHER_MEANINGS = {("training/tracking.py", ".magmadnn")}


def _joined(tree: ast.AST) -> set[int]:
    """The string literals used as a path: joined with `/`, or given to Path()."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found |= {id(node.left), id(node.right)}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Path":
            found |= {id(a) for a in node.args}
    return found


def _spelt(path, names: set[str]) -> list[str]:
    """The string literals of a module that are one of `names`: a file's name (with a dot) anywhere but
    a docstring, a folder's name (checkpoints, trials) where it is used as a path (the same word as a
    config key, `search.trials`, is not)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    joined, where = _joined(tree), str(path.relative_to(PACKAGE))
    return [f"{where}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in docs
            and ("." in n.value or id(n) in joined or HOME in path.parents) and (where, n.value) not in OTHER_MEANINGS]


def test_every_file_of_a_run_is_named_once_by_the_run_folder():
    names = set(_names().values())
    home = [spelt for p in HOME.glob("*.py") for spelt in _spelt(p, names)]
    assert sorted(s.rsplit(" ", 1)[1] for s in home) == sorted(repr(n) for n in names), home  # each once
    strays = [s for p in sorted(PACKAGE.rglob("*.py")) if HOME not in p.parents for s in _spelt(p, names)]
    assert not strays, "file names of a run spelt outside the run folder:\n" + "\n".join(strays)


def test_the_folder_names_each_file_in_its_place(tmp_path):
    from magmadnn_cli.training.run_folder import RunFolder
    folder = RunFolder(tmp_path / "run")
    for key, name in _names().items():
        if key.startswith("CHECKPOINT_"):
            continue
        assert getattr(folder, key.lower()) == tmp_path / "run" / name, key
    assert folder.trial(3).path == tmp_path / "run" / RunFolder.TRIALS / "3"
    assert RunFolder.holding(folder.checkpoint(12)).path == folder.path
    assert folder.checkpoint(12).parent == folder.checkpoints


def _checkpointed(tmp_path):
    from magmadnn_cli.training.run_folder import RunFolder
    folder = RunFolder(tmp_path / "run")
    folder.checkpoints.mkdir(parents=True)
    for step in (3, 20, 100):
        folder.checkpoint(step).write_bytes(b"")
    folder.config.write_text("name: run\n")
    folder.marker.write_text('{"kind": "run"}')
    return folder


def test_one_resolution_of_a_folder(tmp_path):
    """A run stopped before its model: --init-from and --resume take its newest checkpoint; predict is
    told how to continue it. With its model: every command takes the model."""
    from magmadnn_cli.errors import ModelFileError
    from magmadnn_cli.training.run_folder import RunFolder
    folder = _checkpointed(tmp_path)
    newest = folder.checkpoint(100)
    assert RunFolder.starting_file(folder.path) == newest
    assert RunFolder.to_resume(folder.path) == newest == RunFolder.to_resume(folder.checkpoints)
    with pytest.raises(ModelFileError, match=f"newest checkpoint: {newest.name}.*--resume {folder.path}"):
        RunFolder.model_file(folder.path)
    folder.model.write_bytes(b"")
    assert RunFolder.model_file(folder.path) == RunFolder.starting_file(folder.path) == folder.model
    assert RunFolder.model_file(folder.model) == folder.model


def test_a_runs_config_given_for_its_model_names_the_model(tmp_path):
    from magmadnn_cli.errors import ModelFileError
    from magmadnn_cli.training.run_folder import RunFolder
    folder = _checkpointed(tmp_path)
    folder.model.write_bytes(b"")
    with pytest.raises(ModelFileError, match="the run's model is beside it"):
        RunFolder.model_file(folder.config)


def test_the_run_folder_modules_import_each_other_without_a_circle():
    graph = {}
    for path in HOME.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        graph[path.stem] = found - {path.stem}
    assert graph["folder"] <= {"holder"}, graph  # the object at the bottom: names, paths, resolution

    def visit(module: str, seen: tuple[str, ...]) -> None:
        assert module not in seen, f"import circle: {' -> '.join((*seen, module))}"
        for imported in sorted(graph.get(module, ())):
            visit(imported, (*seen, module))

    for module in sorted(graph):
        visit(module, ())


def test_commands_lists_the_commands():
    """The search's helpers live in the tune command's package; the run folder's in training/."""
    commands = PACKAGE / "commands"
    helpers = {"trial_config", "trial_log", "search_space", "objective", "run_dir", "set_aside", "made_files"}
    assert not {p.stem for p in commands.glob("*.py")} & helpers
    assert (commands / "tune" / "__init__.py").is_file()
