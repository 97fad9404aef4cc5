"""The allowed dependencies of ARCHITECTURE.md, checked on the source: the
library never imports the CLI, and only the dashboard's route table knows
every handler module."""

from __future__ import annotations

import ast
from pathlib import Path

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


# Who may reach an App's Database (``app.database``) directly: the App itself,
# the database layer, and the parts that run a worker loop with their own
# operation context (the worker, pgqueue.testing's drain). The dashboard's own
# read statements go through one gateway, dashboard/data.py. Everything else
# (the CLI, the HTTP API, Django, tasks) goes through App's public methods.
DATABASE_USERS = {
    "app.py",
    "app_async.py",
    "app_sync.py",
    "app_base.py",
    "health_report.py",
    "router.py",  # closes the async pool before its event loop ends
    "dashboard/data.py",
    "testing/drain.py",
    "testing/isolation.py",  # copies the pool sizes into the test App
    "telemetry/doctor.py",
}


def _database_reads(path: Path) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr == "database"
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]


def test_only_the_app_and_its_named_parts_reach_its_database() -> None:
    cli = PACKAGE.parent / "cli" / "pgqueue_cli"
    candidates = [
        (str(p.relative_to(PACKAGE)), p)
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] != "worker"
    ] + [(f"cli/{p.relative_to(cli)}", p) for p in cli.rglob("*.py")]
    offenders = [
        f"{name}:{line}"
        for name, path in candidates
        if name not in DATABASE_USERS
        for line in _database_reads(path)
    ]
    assert offenders == []
