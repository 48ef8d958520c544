"""The import rule of docs/architecture.md: imports only point down the layers, and no
module imports itself back through others (no cycles).

Every ``import stability...`` and ``from stability... import`` in the package is read from
the source, including imports inside functions, which a runtime check would miss.
"""

import ast
import functools
from pathlib import Path

import pytest

import stability

PACKAGE = Path(stability.__file__).parent

#: Layer of each folder, bottom first; a module may import its own layer or lower ones.
ENGINE = ("core", "compat", "data", "model", "testing", "train", "sweep", "report")
#: The features, one layer above the engine: each imports the engine, never another feature.
FEATURES = ("check", "claims", "doctor", "explore", "zoo")
LAYERS = (*ENGINE, "features")
TOP = len(LAYERS)  # stability/__init__.py, __main__.py, cli.py, plugin.py, ...
#: Folders of the top layer: the command line's subcommands, and the zoo's bug programs
#: (written as users write them: ``from stability import Recipe, register_variant``).
TOP_FOLDERS = ("commands", "zoo.bugs")
#: Deprecated module -> the package its names moved to. A shim re-exports from there, so
#: that import is exempt from the rule; nothing in the package may import the shim.
SHIMS = {
    "stability.model.conformance": "stability.testing",
    "stability.model.conformance_adapters": "stability.testing",
    "stability.model.softmax_inputs": "stability.testing",
}
#: Package modules that still import a shim, each waiting on its owner's change; the test
#: fails once one stops, so its entry goes with it.
STILL_ON_A_SHIM: dict[str, set[str]] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    if any(module == f"stability.{f}" or module.startswith(f"stability.{f}.") for f in TOP_FOLDERS):
        return TOP
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FEATURES:
        return LAYERS.index("features")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in ENGINE else TOP


def feature_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if layer_of(module) == LAYERS.index("features") else None


def imports_of(path: Path) -> set[str]:
    """The ``stability`` modules that the file at ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("stability")}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "stability"
        ):
            # `from stability.data import registry` imports a module, not a name.
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                path = PACKAGE.parent / sub.replace(".", "/")
                found.add(sub if path.is_dir() or path.with_suffix(".py").exists() else node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{source} ({LAYERS[layer_of(source)] if layer_of(source) < TOP else 'top'}) imports "
        f"{target} ({LAYERS[layer_of(target)] if layer_of(target) < TOP else 'top'})"
        for source, targets in graph.items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(source) and not _moved_to(source, target)
    ]


def cross_feature_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one feature package into another (features meet only on the top layer)."""
    return [
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in sorted(targets)
        if feature_of(source) and feature_of(target) and feature_of(source) != feature_of(target)
    ]


def _moved_to(source: str, target: str) -> bool:
    home = SHIMS.get(source)
    return home is not None and (target == home or target.startswith(home + "."))


def shim_importers(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """module -> the deprecated shims it imports, for every module that imports one."""
    found = {source: targets & set(SHIMS) for source, targets in graph.items()}
    return {source: shims for source, shims in found.items() if shims}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between modules; a package's ``__init__`` importing its own modules
    is not one (Python imports a package before its modules by design)."""
    found, state = [], {}

    def edges(module):
        return [t for t in graph.get(module, ()) if t in graph and not module.startswith(t + ".")]

    def visit(module, path):
        state[module] = "open"
        for target in edges(module):
            if state.get(target) == "open":
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
    return found


def test_every_module_sits_in_a_known_layer():
    for path in PACKAGE.rglob("*.py"):
        folder = path.relative_to(PACKAGE).parts
        known = len(folder) == 1 or folder[0] in ENGINE + FEATURES or folder[0] == "commands"
        assert known, f"{path}: not in a layer folder"


def test_imports_only_point_down():
    assert upward_imports(import_graph()) == []


def test_features_never_import_each_other():
    assert cross_feature_imports(import_graph()) == []


def test_nothing_imports_a_deprecated_shim():
    """The package raises no DeprecationWarning of its own: it imports the new paths."""
    assert shim_importers(import_graph()) == STILL_ON_A_SHIM


def test_no_import_cycles():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(
    "graph, kind",
    [
        (
            {
                "stability.core.errors": {"stability.claims.table"},
                "stability.claims.table": set(),
            },
            "up",
        ),
        (
            {"stability.data.a": {"stability.data.b"}, "stability.data.b": {"stability.data.a"}},
            "cycle",
        ),
    ],
    ids=["upward", "cycle"],
)
def test_the_rule_can_fail(graph, kind):
    if kind == "up":
        # A shim may import its new home, but not the layers above that.
        shim = {"stability.model.conformance": {"stability.testing.x", "stability.train.y"}}
        assert upward_imports(shim) == [
            "stability.model.conformance (model) imports stability.train.y (train)"
        ]
        assert shim_importers({"stability.report.z": {"stability.model.conformance"}}) == {
            "stability.report.z": {"stability.model.conformance"}
        }
        assert upward_imports(graph) == [
            "stability.core.errors (core) imports stability.claims.table (features)"
        ]
        assert cross_feature_imports({"stability.zoo.run": {"stability.doctor.run"}}) == [
            "stability.zoo.run imports stability.doctor.run"
        ]
    else:
        assert cycles(graph) == [["stability.data.a", "stability.data.b", "stability.data.a"]]


@functools.cache
def _top_level_names(path: Path) -> tuple[set[str], set[str]]:
    """(names ``path`` defines, names it imports), at module level."""
    defined, imported = set(), set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            imported |= {a.asname or a.name for a in node.names}
    return defined, imported


def forwarded_imports(files: list[Path]) -> list[str]:
    """``from stability.m import name`` where module ``m`` does not define ``name`` but only
    imports it: a second import path for one name. A package's ``__init__`` (its public
    surface) and a deprecated shim may forward; nothing may import through another module."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            source = PACKAGE.parent / node.module.replace(".", "/")
            if not source.with_suffix(".py").exists() or node.module in SHIMS:
                continue
            defined, imported = _top_level_names(source.with_suffix(".py"))
            found += [
                f"{path.name}: {node.module}.{a.name}"
                for a in node.names
                if a.name in imported - defined
                and not (source / a.name).with_suffix(".py").exists()
            ]
    return found


def test_one_import_path_for_each_name():
    tests = Path(__file__).parent
    files = [*PACKAGE.rglob("*.py"), *tests.rglob("*.py"), *tests.parent.glob("benchmarks/*.py")]
    assert forwarded_imports(files) == []
