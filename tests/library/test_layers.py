"""The package's layers run one way, and the training program is assembled in one place.

Every import statement of the package and of the repository's benchmarks/ is read, those inside
functions included:
- the core (`jaxtrain._src`) imports neither the public face nor the tools;
- the public face (`jaxtrain`, `jaxtrain.data`, ..., `jaxtrain.engine`) imports no tool;
- nothing in the package imports a benchmark (`benchmarks`, at the top, is not installed);
- the tools import no `jaxtrain._src`: only `jaxtrain`, `jaxtrain.engine` and the public namespaces;
- no module imports itself back through others (no circle);
and every call of the builders of a training program is in `_src/program.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
ROOT = CHECKOUT / "src"
PACKAGE = ROOT / "jaxtrain"
BENCHMARKS = CHECKOUT / "benchmarks"  # above the tools, outside the package
BUILDERS = {"make_train_step", "init_state", "build_optimizer", "build_train_optimizer", "CompiledCalls",
            "make_multi_step", "make_gather_step", "make_stacked_step", "fuse_steps"}
BUILDER_HOME = {"jaxtrain._src.program"}
# where a builder is defined, or a compiled call is made of its parts (the builder's own helpers)
DEFINED_IN = {"jaxtrain._src.step", "jaxtrain._src.state", "jaxtrain._src.optim", "jaxtrain._src.calls",
              "jaxtrain._src.compiling", "jaxtrain._src.feeds", "jaxtrain._src.rl.replay"}


def _modules() -> dict[str, Path]:
    found = {}
    for top, where in ((PACKAGE, ROOT), (BENCHMARKS, CHECKOUT)):
        for path in top.rglob("*.py"):
            parts = path.relative_to(where).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    if module.split(".")[0] == "benchmarks":
        return "benchmarks"
    if module.startswith("jaxtrain._src"):
        return "core"
    if module.startswith("jaxtrain.tools") or module == "jaxtrain.__main__":
        return "tools"
    return "face"


def _import_statements(source: str, package: str) -> Iterator[tuple[ast.AST, list[str]]]:
    """Each import of `source` (a module of `package`), inside functions too, with the dotted names
    it may import, relative ones made absolute (`from jaxtrain import _src`: `jaxtrain`,
    `jaxtrain._src`); `importlib.import_module("...")` of a written-out name counts too."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            names = [str(node.args[0].value)]
        else:
            continue
        yield node, names


def _imports(module: str, path: Path) -> set[str]:
    """The package modules `module` imports anywhere in its source (inside functions too)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _, names in _import_statements(path.read_text(), package):
        for name in names:
            while name and name not in MODULES:  # a name inside a module: the module
                name = name.rpartition(".")[0]
            if name and name != module and name.split(".")[0] in ("jaxtrain", "benchmarks"):
                found.add(name)
    return found


# `jaxtrain bench` (tools/cli.py: `_benchmarks`) loads the checkout's benchmarks/ by name when there is one,
# and says in one line that there is none where jaxtrain is installed: the one way in from below, and the
# only edge the graph leaves out.
BENCH_DISPATCH = ("jaxtrain.tools.cli", "benchmarks")
GRAPH = {m: _imports(m, p) - ({BENCH_DISPATCH[1]} if m == BENCH_DISPATCH[0] else set()) for m, p in MODULES.items()}
ORDER = {"core": 0, "face": 1, "tools": 2, "benchmarks": 3}


def test_no_import_from_a_lower_layer_into_a_higher_one():
    wrong = sorted(f"{m} ({_layer(m)}) imports {i} ({_layer(i)})" for m, deps in GRAPH.items() for i in deps
                   if ORDER[_layer(i)] > ORDER[_layer(m)] and not _is_parent_package(i, m))
    assert wrong == []


def test_nothing_in_the_package_imports_a_benchmark():
    # the wheel holds no benchmark: an import of one would fail where jaxtrain is installed (`jaxtrain bench`
    # loads the checkout's folder by name, tools/cli.py)
    assert len([m for m in MODULES if _layer(m) == "benchmarks"]) > 30
    assert sorted(f"{m} imports {i}" for m, deps in GRAPH.items() for i in deps
                  if m.startswith("jaxtrain") and _layer(i) == "benchmarks") == []


def _is_parent_package(imported: str, module: str) -> bool:
    """Importing `jaxtrain._src.x` runs `jaxtrain/__init__.py` first; that is no import of the face."""
    return imported == "jaxtrain"


def test_no_import_circle():
    def strongly_connected() -> list[list[str]]:  # Tarjan
        index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

        def visit(v: str) -> None:
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in GRAPH.get(v, ()):
                if w == "jaxtrain" or w not in GRAPH:
                    continue
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))

        for v in GRAPH:
            if v not in index:
                visit(v)
        return out

    # a package's __init__ re-exporting its own modules is not a circle of code
    circles = [c for c in strongly_connected() if not _only_package_reexports(c)]
    assert circles == []


def _only_package_reexports(group: list[str]) -> bool:
    """Edges child -> parent package inside the group come only from importing a sibling through
    the package (`from jaxtrain._src.rl import clique`): drop them and see whether a circle is left."""
    members = set(group)
    edges = {m: {d for d in GRAPH[m] if d in members and not m.startswith(d + ".")} for m in group}
    seen: set[str] = set()

    def cyclic(v: str, path: set[str]) -> bool:
        if v in path:
            return True
        if v in seen:
            return False
        seen.add(v)
        return any(cyclic(w, path | {v}) for w in edges[v])

    return not any(cyclic(v, set()) for v in group)


def test_the_training_program_is_assembled_in_one_place():
    calls = []
    for module, path in MODULES.items():
        if module in BUILDER_HOME | DEFINED_IN:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name in BUILDERS:
                    calls.append(f"{module}:{node.lineno} calls {name}")
    assert calls == []


def test_one_training_loop_for_one_run_and_for_populations():
    """Only the loop (`training.train`) takes a feed's batches to the compiled calls: `fit` and
    `fit_population` both run it, so no second copy of the loop can drift (benchmarks that time a
    call by hand sit above the library)."""
    takers = []
    for module, path in MODULES.items():
        if not module.startswith("jaxtrain._src"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "next_args":
                if not (isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", "") == "super"):
                    takers.append(module)
    assert sorted(set(takers)) == ["jaxtrain._src.training"]


@pytest.mark.parametrize("planted, expected", [
    ("from jaxtrain.tools import cli\n", "imports jaxtrain.tools.cli"),
    ("def f():\n    from benchmarks import faults\n", "imports benchmarks.faults"),
])
def test_the_layer_check_sees_imports_inside_functions(planted, expected, tmp_path):
    path = tmp_path / "planted.py"
    path.write_text(planted)
    assert any(expected.endswith(i) for i in _imports("jaxtrain._src.planted", path))


def test_a_run_is_assembled_in_one_place():
    """`fit` and `fit_population` get their runs from `assembly.assemble`: a `Run` (or a kind of
    one) is constructed there and nowhere else in the package, so the two cannot drift apart again."""
    kinds, trees = {"Run"}, {module: ast.parse(path.read_text()) for module, path in MODULES.items()}
    for tree in trees.values():
        kinds |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                  and any(getattr(base, "id", getattr(base, "attr", None)) == "Run"
                          or getattr(getattr(base, "value", None), "id", None) == "Run" for base in node.bases)}
    made = [f"{module}:{node.lineno} makes a {node.func.id}" for module, tree in trees.items()
            for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in kinds]
    assert made == [] and "_MemberRun" in kinds


TOOLS = PACKAGE / "tools"
PRIVATE = "jaxtrain._src"


def _private(name: str) -> bool:
    return name == PRIVATE or name.startswith(PRIVATE + ".")


def _private_imports(source: str, package: str) -> list[tuple[int, str]]:
    """`(line, statement)` of each import of `jaxtrain._src` in `source` (a module of `package`),
    inside functions too: `import jaxtrain._src...`, `from jaxtrain._src... import`, `from jaxtrain
    import _src`, relative forms of them, and `importlib.import_module("jaxtrain._src...")`."""
    return [(node.lineno, ast.unparse(node)) for node, names in _import_statements(source, package)
            if any(_private(name) for name in names)]


def test_the_tools_import_no_private_module():
    # The tools stand on what users may stand on: `jaxtrain`, `jaxtrain.engine`, `jaxtrain.data`, ...
    paths = sorted(TOOLS.rglob("*.py"))
    assert len(paths) > 20  # the walk sees the tools
    wrong = [f"{p.relative_to(ROOT)}:{line}: {statement}" for p in paths
             for line, statement in _private_imports(p.read_text(), ".".join(p.relative_to(ROOT).parent.parts))]
    assert wrong == []


@pytest.mark.parametrize("planted", [
    "import jaxtrain._src.loop\n",
    "import jaxtrain._src as core\n",
    "from jaxtrain._src.loop import run\n",
    "from jaxtrain._src import loop\n",
    "from jaxtrain import _src\n",
    "from jaxtrain import fit, _src as core\n",
    "def f():\n    from jaxtrain._src.memory import format_bytes\n",
    "class C:\n    def f(self):\n        import jaxtrain._src\n",
    "from ... import _src\n",
    "from ..._src.errors import ConfigError\n",
    "import importlib\nimportlib.import_module('jaxtrain._src.loop')\n",
])
def test_the_private_import_check_sees_each_form(planted):
    # as if planted in jaxtrain/tools/report/, the last line of each plant is the import
    assert [line for line, _ in _private_imports(planted, "jaxtrain.tools.report")] == [planted.count("\n")]


@pytest.mark.parametrize("clean", [
    "import jaxtrain\n", "import jaxtrain.engine\n", "from jaxtrain import engine, fit\n",
    "from jaxtrain.engine import build_program\n", "from jaxtrain.data import HDF5Source\n",
    "from jaxtrain import data as data_lib\n", "from .. import runs\n", "import jaxtrain._srcs\n",
])
def test_the_private_import_check_passes_public_imports(clean):
    assert _private_imports(clean, "jaxtrain.tools.report") == []
