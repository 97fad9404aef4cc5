"""Imports follow the layers (ARCHITECTURE.md).

The import graph of ``pgqueue/`` is read from the source (AST), counting
every import: module level, inside functions and under ``TYPE_CHECKING``
(a type is a dependency too). Two rules:

* ``pgqueue/ops`` and the pure modules import nothing above them: a pure
  module imports only pure modules, an operation only pure modules and
  other operations. A type both sides need lives down here (a Protocol or
  a dataclass), not in the module above.
* No import circle spans two packages. A circle inside one package (its
  modules all in one directory) is allowed.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "pgqueue"

#: The bottom layer: modules that import nothing of pgqueue but each other.
PURE = frozenset(
    {
        "pgqueue.models",
        "pgqueue.events",
        "pgqueue.validation",
        "pgqueue.durations",
        "pgqueue.payloads",
        "pgqueue.jsonable",
        "pgqueue.errors",
        "pgqueue.queries",
        # Leaves the operations use: statement text, schema revision, parsers.
        "pgqueue._resources",
        "pgqueue.version",
        "pgqueue.commands",
        "pgqueue.explain",
        "pgqueue.cron",
        "pgqueue.retry",
        "pgqueue.health_report",
    }
)
#: The operations: they may import PURE and each other.
OPS = "pgqueue.ops"
#: The database layer, which runs operations: it may import PURE, OPS and itself.
DATABASE = frozenset(
    {"pgqueue.database", "pgqueue.connection", "pgqueue.driver_async", "pgqueue.driver_sync"}
)
#: Telemetry: it may import PURE, OPS, DATABASE and itself.
TELEMETRY = "pgqueue.telemetry"
#: What the worker may not import: the App and its handles, which run the
#: worker (the worker names what it reads of them: WorkerHost, RunnableTask).
APP = frozenset(
    {
        "pgqueue.app",
        "pgqueue.app_async",
        "pgqueue.app_base",
        "pgqueue.app_sync",
        "pgqueue.task",
        "pgqueue.workflow",
        "pgqueue.router",
    }
)
WORKER = "pgqueue.worker"

#: Circles across packages still left, each the sorted list of its modules.
#: None: shrink this list, never grow it.
KNOWN_CIRCLES: list[list[str]] = []


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        init = parts[-1] == "__init__"
        if init:
            parts.pop()
        out[".".join(parts)] = (path, init)
    return out


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Module -> {module of the package it imports: first line}, every
    import counted (module level, function-local, TYPE_CHECKING)."""
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        while name:
            if name in mods:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, dict[str, int]] = {}
    for mod, (path, init) in mods.items():
        edges: dict[str, int] = {}
        package = mod if init else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                # ``from pkg import sub`` imports the submodule pkg.sub.
                targets = [
                    resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else resolve(base)
                    for a in node.names
                ]
            for target in targets:
                if target is not None and target != mod:
                    edges.setdefault(target, node.lineno)
        graph[mod] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one
    module, each sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def package_of(module: str, graph: dict[str, dict[str, int]]) -> str:
    """The package whose directory holds ``module``'s file."""
    is_package = any(other.startswith(module + ".") for other in graph)
    return module if is_package else module.rpartition(".")[0]


def cross_package_circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    return [c for c in circles(graph) if len({package_of(m, graph) for m in c}) > 1]


def upward_imports(graph: dict[str, dict[str, int]], pure: Iterable[str], ops: str) -> list[str]:
    """Imports of an operation or a pure module from a layer above them."""
    pure = frozenset(pure)

    def is_ops(m: str) -> bool:
        return m == ops or m.startswith(ops + ".")

    bad = []
    for mod, edges in sorted(graph.items()):
        if mod in pure:
            allowed = pure.__contains__
        elif is_ops(mod):
            allowed = lambda m: m in pure or is_ops(m)  # noqa: E731
        else:
            continue
        bad += [f"{mod}:{line} imports {t}" for t, line in sorted(edges.items()) if not allowed(t)]
    return bad


def _in(package: str) -> Callable[[str], bool]:
    return lambda m: m == package or m.startswith(package + ".")


def imports_outside(
    graph: dict[str, dict[str, int]],
    importer: Callable[[str], bool],
    allowed: Callable[[str], bool],
) -> list[str]:
    """Imports of the modules ``importer`` accepts that ``allowed`` refuses."""
    return [
        f"{mod}:{line} imports {target}"
        for mod, edges in sorted(graph.items())
        if importer(mod)
        for target, line in sorted(edges.items())
        if not allowed(target)
    ]


def test_the_named_modules_exist() -> None:
    graph = import_graph(ROOT)
    named = PURE | DATABASE | APP | {OPS, TELEMETRY, WORKER}
    assert not named - graph.keys(), sorted(named - graph.keys())


def test_ops_and_pure_modules_import_nothing_above_them() -> None:
    assert upward_imports(import_graph(ROOT), PURE, OPS) == []


def test_the_database_layer_and_telemetry_import_nothing_above_them() -> None:
    graph = import_graph(ROOT)
    below_db = lambda m: m in PURE or _in(OPS)(m) or m in DATABASE  # noqa: E731
    assert imports_outside(graph, DATABASE.__contains__, below_db) == []
    below_telemetry = lambda m: below_db(m) or _in(TELEMETRY)(m)  # noqa: E731
    assert imports_outside(graph, _in(TELEMETRY), below_telemetry) == []


def test_the_worker_imports_nothing_of_the_app() -> None:
    graph = import_graph(ROOT)
    assert imports_outside(graph, _in(WORKER), lambda m: m not in APP) == []


def test_no_import_circle_spans_two_packages() -> None:
    # Circles inside one package are allowed: today the App with its Task and
    # Workflow handles (pgqueue/), and within pgqueue/ops, pgqueue/worker,
    # pgqueue/telemetry, pgqueue/http and pgqueue/contrib/django. Those
    # across packages are exactly the known ones.
    assert cross_package_circles(import_graph(ROOT)) == KNOWN_CIRCLES


def test_the_checks_fail_on_a_planted_tree(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "models.py": "from pkg.ops import Op\n",  # pure -> ops: upward
        "app.py": "from pkg.worker import run\n",
        "ops/__init__.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.app import App\n",  # ops -> app, for a type
        "ops/a.py": "from . import b\n",
        "ops/b.py": "def f():\n    from pkg.ops import a\n",  # a circle inside ops: allowed
        "worker/__init__.py": "",
        "worker/run.py": "def g():\n    import pkg.app\n",  # app <-> worker.run
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert upward_imports(graph, {"pkg.models"}, "pkg.ops") == [
        "pkg.models:1 imports pkg.ops",
        "pkg.ops:3 imports pkg.app",
    ]
    assert circles(graph) == [["pkg.app", "pkg.worker.run"], ["pkg.ops.a", "pkg.ops.b"]]
    assert cross_package_circles(graph) == [["pkg.app", "pkg.worker.run"]]
    assert imports_outside(graph, _in("pkg.worker"), lambda m: m != "pkg.app") == [
        "pkg.worker.run:2 imports pkg.app"
    ]
