"""Where the shipped SQL and Alembic files live.

In a wheel they are package data (``pgqueue/_sql``, ``pgqueue/_migrations``);
in a checkout they are the top-level ``sql/`` and ``migrations/`` folders.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _find(packaged: str, checkout: str) -> Path:
    for candidate in (_PACKAGE_DIR / packaged, _PACKAGE_DIR.parent / checkout):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(
        f"pgqueue is installed without its {checkout}/ files "
        f"(looked in {_PACKAGE_DIR / packaged} and {_PACKAGE_DIR.parent / checkout})"
    )


@cache
def sql_dir() -> Path:
    """The folder holding ``queries/`` and ``migrations/`` SQL files."""
    return _find("_sql", "sql")


@cache
def migrations_dir() -> Path:
    """The Alembic script location."""
    return _find("_migrations", "migrations")
