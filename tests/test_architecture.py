"""The folders show the architecture, and each outside library stays in its layer: cupy only in
core/, mpi4py only in distributed/, typer and rich only in the CLI and reporting."""

from __future__ import annotations

import ast
import re

import numpy as np

import pytest

from conftest import ROOT

PACKAGE = ROOT / "magmadnn_cli"
OWNERS = {"cupy": ("core/",), "mpi4py": ("distributed/",), "typer": ("cli.py",), "rich": ("cli.py", "reporting.py"),
          "onnx": ("training/onnx_graph.py",)}


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
    assert folders == sorted(LAYERS)
    assert not (PACKAGE / "config" / "schema.py").read_text().count("import numpy")


LAYERS = ["commands", "inference", "training", "distributed", "nn", "data", "config", "core"]  # top to bottom


def _imported_folders(path) -> set[str]:
    """The package folders a module imports from (relative imports resolved)."""
    rel = path.relative_to(PACKAGE).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = list(rel[:-1])[:len(rel) - node.level] if node.level > 1 else list(rel[:-1])
            parts = base + [m for m in (node.module or "").split(".") if m]
            if parts and parts[0] in LAYERS:
                found.add(parts[0])
    return found


def test_imports_point_down_the_layers():
    """A folder imports only from the folders below it (DESIGN.md's layers; the inference layer sits
    under the commands and over training)."""
    ups = []
    for path in sorted(PACKAGE.rglob("*.py")):
        top = path.relative_to(PACKAGE).parts[0]
        if top not in LAYERS:
            continue
        ups += [f"{path.relative_to(PACKAGE)} imports {t}" for t in _imported_folders(path)
                if LAYERS.index(t) < LAYERS.index(top)]
    assert not ups, ups


# -- distributed strategies: one registry ------------------------------------------------------------
STRATEGY_NAMES = {"allreduce", "ring", "parameter_server", "shared_memory", "async"}


def _strategy_literals(node: ast.AST) -> list[str]:
    """The strategy names written as string literals in one operand of a comparison."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in STRATEGY_NAMES]


def test_strategy_names_are_compared_only_inside_distributed():
    """Outside distributed/ code asks the strategy for a fact (`strategy_of(config).model_parallel`)
    instead of comparing its name (`config.distributed.strategy == "async"`)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        if where.startswith("distributed/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [n for operand in (node.left, *node.comparators) for n in _strategy_literals(operand)]
                found += [f"{where}:{node.lineno} compares {n!r}" for n in names]
    assert not found, "strategy names compared outside distributed/:\n" + "\n".join(found)


def test_the_config_names_exactly_the_registered_strategies():
    from typing import get_args

    from magmadnn_cli.config.schema import DistributedConfig
    from magmadnn_cli.distributed.strategies import STRATEGIES
    assert set(get_args(DistributedConfig.model_fields["strategy"].annotation)) == set(STRATEGIES)
    assert set(STRATEGIES) == STRATEGY_NAMES | {"auto"}


def _distributed_imports(path) -> set[str]:
    """The distributed/ modules `path` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 2 and (node.module or "").startswith("distributed"):
            parts = node.module.split(".")
            found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
    return found


def test_distributed_modules_import_each_other_without_a_circle():
    """Every import counts, a lazy one inside a function too: it still makes each module's meaning
    depend on the other. Base modules (comm, data_parallel) import no strategy's module; the
    registry (strategies) imports them."""
    folder = PACKAGE / "distributed"
    graph = {p.stem: _distributed_imports(p) - {p.stem} for p in folder.glob("*.py")}
    assert graph["comm"] == set() and graph["data_parallel"] == {"comm"}, graph
    assert {"mpi", "shared", "async_sgd", "model_parallel", "data_parallel"} <= graph["strategies"], graph
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in sorted(graph.get(module, ())):
                visit(imported, (*path, module))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_the_strategy_registry_loads_neither_numpy_nor_mpi():
    """`magmadnn_cli.distributed` is imported before the launcher limits BLAS threads (numpy not yet
    loaded), and mpi4py initializes MPI on import: the registry loads implementations when used."""
    import subprocess
    import sys
    code = ("import sys, magmadnn_cli.distributed, magmadnn_cli.distributed.strategies\n"
            "print(sorted(m for m in ('numpy', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- one declaration per component -----------------------------------------------------------------
def _kinds():
    from magmadnn_cli.config.layers import LayerSpec
    from magmadnn_cli.config.losses import LossSpec
    from magmadnn_cli.config.optimizers import OptimizerBase
    from magmadnn_cli.nn.layers import Layer
    from magmadnn_cli.nn.losses import Loss
    from magmadnn_cli.nn.optimizers import Optimizer
    return {"layer": (LayerSpec, Layer), "loss": (LossSpec, Loss), "optimizer": (OptimizerBase, Optimizer)}


@pytest.mark.parametrize("kind", ["layer", "loss", "optimizer"])
def test_every_declaration_has_exactly_one_implementation_and_back(kind):
    declaration, runtime = _kinds()[kind]
    declared, implemented = declaration.declarations, runtime.implementations
    assert declared and set(declared) == set(implemented), f"{kind}s declared but not implemented, or back"
    for tag, cls in implemented.items():
        assert cls.declaration is declared[tag], f"{cls.__name__} implements {tag!r} with another declaration"
    some = next(iter(implemented.values()))
    with pytest.raises(TypeError, match="already implemented"):
        type("Twin", (some,), {"declaration": some.declaration})


@pytest.mark.parametrize("kind", ["layer", "loss", "optimizer"])
def test_the_runtime_restates_no_hyperparameter(kind):
    """A runtime class takes its validated declaration: no default or range of its own."""
    import inspect
    _, runtime = _kinds()[kind]
    allowed = {"self", "declared", "name", "steps_per_epoch", "epochs", "epoch_of_step", "sweep",
               "schedule", "named"}  # (the last two: a subclass passing the base's on)
    for cls in {runtime, *runtime.implementations.values()}:
        extra = set(inspect.signature(cls.__init__).parameters) - allowed
        assert not extra, f"{cls.__name__}.__init__ takes {sorted(extra)}: hyperparameters belong to its declaration"


def test_the_config_unions_are_the_declarations():
    from typing import get_args
    from magmadnn_cli.config.layers import InitializerName, InitializerSpec, LayerSpec
    from magmadnn_cli.config.losses import LossSpec
    from magmadnn_cli.config.optimizers import OptimizerBase, ScheduleBase
    from magmadnn_cli.config.schema import Layer, Loss, Optimizer, Schedule, union_tags
    from magmadnn_cli.nn.initializers import FACTORIES, INITIALIZERS
    for union, base in ((Layer, LayerSpec), (Loss, LossSpec), (Optimizer, OptimizerBase), (Schedule, ScheduleBase)):
        assert union_tags(union) <= set(base.declarations) and union_tags(union)
    for schedule in ScheduleBase.declarations.values():
        assert "decayed" in vars(schedule), f"{schedule.__name__} declares no math"
    assert set(FACTORIES) == set(InitializerSpec.declarations)
    assert set(INITIALIZERS) == set(get_args(InitializerName)) - set(FACTORIES)


def test_no_table_restates_the_declarations():
    """Facts (a loss's task and fused activation, which layers pass the output through) are read from
    the declarations: the old restating tables are gone."""
    pattern = re.compile(r"^(TASKS|LOSS_OUTPUT|PASS_THROUGH|SCHEDULES)\s*[:=]", re.M)
    found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text())]
    assert not found, found


def test_the_config_layer_knows_nothing_of_numpy():
    numpy = re.compile(r"^\s*(from|import)\s+(numpy|cupy)\b", re.M)
    found = [p.name for p in (PACKAGE / "config").glob("*.py") if numpy.search(p.read_text())]
    assert not found, found


def test_the_config_layer_loads_without_numpy_at_all():
    """Not even through what it imports (it did, through files.py)."""
    import subprocess
    import sys
    blocker = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('numpy', 'cupy'): raise ImportError('blocked: ' + name)\n"
               "sys.meta_path.insert(0, Block())\n"
               "import magmadnn_cli.config.schema, magmadnn_cli.config.loading, magmadnn_cli.config.json_schema\n")
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]


# -- state and collaborators ------------------------------------------------------------------------
def test_no_module_level_state_is_rebound_after_import():
    """No `global` statement and no assignment to another module's attribute (the interpreter's hooks
    aside): the backend is one object chosen per run (`backend.using`), not module globals rebound by
    whoever ran last."""
    import ast
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                   for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} global {', '.join(node.names)}")
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id in modules - {"sys"}):  # sys.excepthook: MPI's abort hook, the interpreter's
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {target.value.id}.{target.attr} =")
    assert not found, found


MUTATORS = {"append", "extend", "update", "pop", "clear", "insert", "remove", "setdefault", "add", "discard", "popitem"}


def _module_containers(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level to a list, dict or set."""
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        made = isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in ("list", "dict", "set", "defaultdict", "OrderedDict", "deque"))
        names |= {t.id for t in targets if made and isinstance(t, ast.Name)}
    return names


def test_no_module_level_container_changes_after_import():
    """A list, dict or set at a module's top level is a constant or a registry filled as the module
    loads: no function changes it (`ACTIVE.append(...)`, `_received[0] = ...`). State a process holds
    (its signals, its communicator, its memory reads) is an object's, named and documented."""
    trees = {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
    containers = set().union(*(_module_containers(tree) for tree in trees.values()))
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                call = isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr in MUTATORS
                changed = inner.func.value if call else next(
                    (t.value for t in getattr(inner, "targets", [getattr(inner, "target", None)])
                     if isinstance(t, ast.Subscript)), None) if isinstance(inner, (ast.Assign, ast.AugAssign)) else None
                if isinstance(changed, ast.Name) and changed.id in containers and changed.id not in _locals(node):
                    found.append(f"{path.relative_to(PACKAGE)}:{inner.lineno} {changed.id}")
    assert not found, found


def _locals(function: ast.AST) -> set[str]:
    """The names a function binds itself (its parameters and assignments): not the module's."""
    args = function.args
    bound = {a.arg for a in args.args + args.kwonlyargs + args.posonlyargs}
    bound |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return bound


def _attribute_assignments(function: ast.AST) -> list[ast.Attribute]:
    targets = [t for node in ast.walk(function) for t in (
        node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
        else [])]
    flat = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
    return [t for t in flat if isinstance(t, ast.Attribute)]


def test_commands_set_no_attribute_of_another_object():
    """A command hands objects what they need through their constructors: it assigns no attribute of an
    object it was given (a parameter) nor of one reached through another (`run.trainer.origin = ...`)."""
    found = []
    for path in sorted((PACKAGE / "commands").rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            given = {a.arg for a in function.args.args + function.args.kwonlyargs} - {"self", "cls"}
            for target in _attribute_assignments(function):
                reached = isinstance(target.value, ast.Attribute) and not ast.unparse(target.value).startswith("self.")
                if reached or (isinstance(target.value, ast.Name) and target.value.id in given):
                    found.append(f"{path.relative_to(PACKAGE)}:{target.lineno} {ast.unparse(target)} =")
    assert not found, found


def test_configs_change_only_through_validated_revisions():
    """Outside config/ a config is changed by `revised` or a config method (validated), never by
    pydantic's `model_copy(update=...)`, which checks nothing."""
    found = [f"{p.relative_to(PACKAGE)}:{i}" for p in sorted(PACKAGE.rglob("*.py")) if "config" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if "model_copy(" in line]
    assert not found, found


def test_the_backend_is_one_object_and_tests_need_no_reset_for_it():
    from magmadnn_cli.core import backend as B
    assert not any(hasattr(B, name) for name in ("xp", "device", "floatx")), "module globals are back"
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    assert "autouse" not in conftest
    with B.using(B.cpu("float64")) as chosen:
        assert B.current() is chosen and B.current().floatx is np.float64
    assert B.current() == B.CPU


def test_the_trainer_has_few_collaborators():
    import inspect
    from magmadnn_cli.training.trainer import Trainer
    assert len(inspect.signature(Trainer.__init__).parameters) - 1 <= 6
    source = inspect.getsource(Trainer)
    assert not re.search(r"--[a-z]", source), "the trainer names CLI flags (advice belongs in training/advice.py)"
    assert "tune_convolutions" not in source, "choosing convolution algorithms is training/convolutions.py's"


def test_only_the_cli_and_reporting_print():
    """Library code reports through the reporter or its return values (a print from a rank bypasses the
    run log, and the quiet flag)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("cli.py", "reporting.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, found


def test_the_readmes_layout_names_every_module():
    """README's Layout is true to the code: every module of the package is named in it."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Layout"):]
    block = block[:block.index("```", block.index("```") + 3)]
    modules = {p.stem for p in PACKAGE.rglob("*.py") if p.stem not in ("__init__", "__main__")}
    missing = sorted(m for m in modules if not re.search(rf"\b{re.escape(m)}\b", block))
    assert not missing, f"README's Layout does not name: {missing}"
