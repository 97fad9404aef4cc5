"""The allowed dependencies of ARCHITECTURE.md, checked on the source: the
library never imports the CLI, only the dashboard's route table knows every
handler module, SQL runs and psycopg's errors are seen only in the database
layer, and only the App and its named parts reach an App's Database."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pgqueue

PACKAGE = Path(pgqueue.__file__).parent
# `manage.py pgqueue ...` runs the CLI inside Django: a bridge to it by design.
CLI_BRIDGES = {"contrib/django/management/commands/pgqueue.py"}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_library_never_imports_the_cli() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if str(path.relative_to(PACKAGE)) not in CLI_BRIDGES
        and any(name.split(".")[0] == "pgqueue_cli" for name in imports(path))
    ]
    assert offenders == []


def test_dashboard_handlers_do_not_import_the_route_table() -> None:
    dashboard = PACKAGE / "dashboard"
    for path in dashboard.glob("*.py"):
        if path.name in ("server.py", "__init__.py"):
            continue
        assert "pgqueue.dashboard.server" not in imports(path), path.name


# --- One way to the database ----------------------------------------------------------
#
# SQL runs in the database layer only: the drivers (``driver_async.py`` and the
# generated ``driver_sync.py``), the pools of ``database.py`` and the error
# translation of ``connection.py``. Everything else, the worker included,
# hands operations to a driver. So nothing else calls ``.execute(``,
# ``.executemany(`` or ``.copy(<statement>)``, and nothing else names psycopg's
# (or psycopg_pool's) errors: above the layer there are only pgqueue.errors.
DATABASE_LAYER = frozenset(
    {
        "pgqueue/connection.py",
        "pgqueue/database.py",
        "pgqueue/driver_async.py",
        "pgqueue/driver_sync.py",
    }
)
SCANNED = {
    "pgqueue": PACKAGE,
    "cli": PACKAGE.parent / "cli" / "pgqueue_cli",
    "pgqueue_pytest": PACKAGE.parent / "pgqueue_pytest",
}
EXECUTING = frozenset({"execute", "executemany"})


def _error_names() -> frozenset[str]:
    import psycopg
    import psycopg.errors
    import psycopg_pool

    names = set(dir(psycopg.errors))
    for module in (psycopg, psycopg_pool):
        names.update(
            name
            for name in dir(module)
            if isinstance(getattr(module, name), type)
            and issubclass(getattr(module, name), BaseException)
        )
    return frozenset(name for name in names if not name.startswith("_"))


ERROR_NAMES = _error_names()


def sources(roots: dict[str, Path]) -> list[tuple[str, Path]]:
    """(name, path) of every module under ``roots``; fails when a root is
    missing or holds no module, so that a scan can never pass on nothing."""
    found: list[tuple[str, Path]] = []
    for prefix, root in roots.items():
        if not root.is_dir():
            raise AssertionError(f"nothing to scan: {root} is missing")
        modules = sorted(root.rglob("*.py"))
        if not modules:
            raise AssertionError(f"nothing to scan: {root} holds no module")
        found += [(f"{prefix}/{p.relative_to(root).as_posix()}", p) for p in modules]
    return found


def database_access(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each statement execution and each use of psycopg's errors."""
    psycopg_names: set[str] = set()  # local names of the psycopg and psycopg_pool modules
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "psycopg.errors":
                    found.append((node.lineno, "import psycopg.errors"))
                if alias.name.split(".")[0] in ("psycopg", "psycopg_pool"):
                    psycopg_names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if node.module == "psycopg.errors":
                found.append((node.lineno, "from psycopg.errors import"))
            elif top in ("psycopg", "psycopg_pool"):
                for alias in node.names:
                    if alias.name == "errors" or alias.name in ERROR_NAMES:
                        found.append((node.lineno, f"from {node.module} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            # ``.copy()`` of a dict or list takes nothing; a cursor's takes a statement.
            if attr in EXECUTING or (attr == "copy" and (node.args or node.keywords)):
                found.append((node.lineno, f".{attr}("))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in psycopg_names
            and (node.attr == "errors" or node.attr in ERROR_NAMES)
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def outside_the_database_layer(roots: dict[str, Path], allowed: frozenset[str]) -> list[str]:
    return [
        f"{name}:{line}: {what}"
        for name, path in sources(roots)
        if name not in allowed
        for line, what in database_access(ast.parse(path.read_text(encoding="utf-8")))
    ]


def test_only_the_database_layer_runs_sql_or_handles_psycopg_errors() -> None:
    assert outside_the_database_layer(SCANNED, DATABASE_LAYER) == []


PLANTED = {
    "worker/loop.py": "async def f(self):\n    await self.conn.execute('SELECT 1')\n",
    "api.py": "def f(cur, rows):\n    cur.executemany('INSERT', rows)\n",
    "bulk.py": "def f(cur):\n    return cur.copy('COPY t FROM STDIN')\n",
    "caught.py": (
        "import psycopg as pg\n\ndef f(run):\n    try:\n        run()\n"
        "    except pg.OperationalError:\n        pass\n"
    ),
    "unique.py": "from psycopg.errors import UniqueViolation\n",
    "pool.py": "from psycopg_pool import PoolTimeout\n",
    "state.py": "import psycopg\n\ndef f(e):\n    return isinstance(e, psycopg.errors.DataError)\n",
}
CLEAN = {
    "clean.py": (
        "import psycopg\nfrom psycopg import sql\n\n"
        "def f(d: dict, conn: psycopg.Connection) -> dict:\n    return d.copy()\n"
    ),
    "database.py": "def f(conn):\n    conn.execute('SELECT 1')\n",  # allowed below
}


def test_the_scan_finds_a_planted_violation(tmp_path: Path) -> None:
    for name, text in {**PLANTED, **CLEAN}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    found = outside_the_database_layer({"pkg": tmp_path}, frozenset({"pkg/database.py"}))
    assert {line.split(":")[0] for line in found} == {f"pkg/{name}" for name in PLANTED}
    assert "pkg/worker/loop.py:2: .execute(" in found  # no exemption for self. nor worker/
    assert "pkg/caught.py:6: pg.OperationalError" in found


def test_the_scan_fails_on_a_missing_or_empty_tree(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="missing"):
        outside_the_database_layer({"pkg": tmp_path / "absent"}, DATABASE_LAYER)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README").write_text("no module here\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="holds no module"):
        outside_the_database_layer({"pkg": tmp_path / "empty"}, DATABASE_LAYER)


# Who may reach a Database held by another object (the App's private
# ``_database`` and ``_listen_database``, a WorkerApp's ``database``): the
# App itself (``self._database``), and the named parts
# that wire a worker or a drain from it. No directory is exempt. Everything
# else (the CLI, the HTTP API, Django, tasks, the dashboard) goes through
# App's methods.
DATABASE_USERS = {
    "router.py",  # closes the async pool before its event loop ends
    "testing/drain.py",  # the WorkerApp's database, for the drain's own reads
    "testing/isolation.py",  # copies the pool sizes into the test App
    "worker/child.py",  # a --pool process child: its context.transaction() pools
    "worker/parts.py",  # WorkerApp.of: what a worker reads of its App, once
    "worker/runner.py",  # closes the async pool before its event loop ends
    "worker/worker.py",  # the WorkerApp's database, handed to the parts
}


def _database_reads(path: Path) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr in ("database", "listen_database", "_database", "_listen_database")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]


def test_only_the_app_and_its_named_parts_reach_its_database() -> None:
    offenders = [
        f"{name}:{line}"
        for name, path in sources(SCANNED)
        if name.removeprefix("pgqueue/") not in DATABASE_USERS
        for line in _database_reads(path)
    ]
    assert offenders == []
