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
