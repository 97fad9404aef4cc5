"""``sql/schema.sql``: the whole current schema, written to be read top-down.

The file is written by hand (types, tables, indexes, then the functions in
the order a job meets them). Until the first release the baseline revision
applies this very file; after it, each change is a numbered revision
(``docs/schema.md``), and this module checks that a database migrated to
head holds exactly what the file creates:

``python -m pgqueue.schema check [--dsn DSN]`` creates two scratch schemas,
one migrated to head through the revisions, one from ``sql/schema.sql``,
dumps both with ``pg_dump`` and exits 1 (printing a diff) when they differ.
``python -m pgqueue.schema dump [--dsn DSN]`` prints the dump of a schema
migrated to head, in a canonical form (``{schema}`` and ``{channel}``
markers), for reading what the database holds.
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from psycopg import sql

from pgqueue._resources import sql_dir
from pgqueue.config import resolve_dsn
from pgqueue.database import Database, run_script
from pgqueue.ops import operator
from pgqueue.queries import channel_for, queries_for, render

__all__ = ["canonical", "dump", "dump_file", "dump_head", "pg_dump_path", "schema_file"]

_SESSION_SETTING = re.compile(
    r"^(SET (statement_timeout|lock_timeout|idle_in_transaction_session_timeout|"
    r"client_encoding|standard_conforming_strings|check_function_bodies|xmloption|"
    r"client_min_messages|row_security|default_tablespace|default_table_access_method)"
    r" = .*;|SELECT pg_catalog\.set_config\('search_path', '', false\);|CREATE SCHEMA \S+;)\n",
    re.MULTILINE,
)
_OBJECT_COMMENT = re.compile(
    r"^--\n-- (Name|PostgreSQL database dump|Dumped).*\n--\n", re.MULTILINE
)
_DUMP_BANNER = re.compile(
    r"^(-- (Dumped (from|by) .*|PostgreSQL database dump( complete)?)|\\(un)?restrict \w+)\n",
    re.MULTILINE,
)


def schema_file() -> Path:
    """The checked-in ``schema.sql``."""
    return sql_dir() / "schema.sql"


def pg_dump_path() -> str:
    """``pg_dump`` on PATH, else in the server binaries ``pg_config`` names."""
    found = shutil.which("pg_dump")
    if found:
        return found
    pg_config = shutil.which("pg_config")
    if pg_config:
        bindir = subprocess.run(
            [pg_config, "--bindir"], check=True, capture_output=True, text=True
        ).stdout.strip()
        candidate = Path(bindir) / "pg_dump"
        if candidate.exists():
            return str(candidate)
    raise RuntimeError("pg_dump not found (PATH, or pg_config --bindir)")


def canonical(dump_text: str, schema: str) -> str:
    """A ``pg_dump --schema-only`` of ``schema`` in a canonical form: session
    settings and per-object banners dropped, the schema name and channel as
    markers."""
    text = _SESSION_SETTING.sub("", dump_text)
    text = _OBJECT_COMMENT.sub("", text)
    text = _DUMP_BANNER.sub("", text)
    channel = sql.Literal(channel_for(schema)).as_string()
    text = text.replace(channel, "{channel}")
    quoted = sql.Identifier(schema).as_string()
    text = text.replace(quoted, "{schema}")
    text = re.sub(rf"(?<![\w\".]){re.escape(schema)}\.", "{schema}.", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n") + "\n"


def dump(dsn: str, schema: str) -> str:
    """The canonical text of ``schema`` as it is in the database at ``dsn``."""
    result = subprocess.run(
        [
            pg_dump_path(),
            "--schema-only",
            "--no-owner",
            f"--schema={schema}",
            f"--exclude-table={schema}.alembic_version",
            # The time-range leaves of the finished partitions: made by
            # maintenance as time goes by, data rather than schema.
            f"--exclude-table={schema}.jobs_*_[0-9]*",
            f"--dbname={dsn}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return canonical(result.stdout, schema)


def _scratch(dsn: str, build: Callable[[str], object]) -> str:
    """Build a scratch schema with ``build(schema)``, dump it, drop it."""
    schema = f"pgqueue_dump_{uuid.uuid4().hex[:12]}"
    try:
        build(schema)
        return dump(dsn, schema)
    finally:
        database = Database(dsn, queries_for(schema))
        with database.connect() as conn:
            database.run(operator.drop_scratch_schema(), conn)


def dump_head(dsn: str) -> str:
    """The canonical dump of a scratch schema migrated to head."""
    from pgqueue.migrate import upgrade

    return _scratch(dsn, lambda schema: upgrade(dsn, schema=schema, output=io.StringIO()))


def dump_file(dsn: str) -> str:
    """The canonical dump of a scratch schema created by ``sql/schema.sql`` alone."""

    def build(schema: str) -> None:
        text = render(schema_file().read_text(encoding="utf-8"), schema)
        database = Database(dsn, queries_for(schema))
        with database.connect() as conn, conn.transaction():
            database.run(operator.create_schema(), conn)
            run_script(conn, text.encode())

    return _scratch(dsn, build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgqueue.schema", description=__doc__)
    parser.add_argument("command", choices=["dump", "check"])
    parser.add_argument("--dsn", default=None, help="database to build scratch schemas in")
    args = parser.parse_args(argv)
    dsn = resolve_dsn(args.dsn)
    head = dump_head(dsn)
    if args.command == "dump":
        sys.stdout.write(head)
        return 0
    from_file = dump_file(dsn)
    if head != from_file:
        sys.stderr.writelines(
            difflib.unified_diff(
                from_file.splitlines(keepends=True),
                head.splitlines(keepends=True),
                "sql/schema.sql",
                "migrated to head",
            )
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
