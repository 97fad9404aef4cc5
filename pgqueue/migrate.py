"""Schema migrations through Alembic.

The baseline revision applies ``sql/schema.sql``; later revisions run their
``sql/migrations/NNNN_name.{up,down}.sql`` files, numbered in apply order.

``upgrade`` is safe to run concurrently (an advisory lock per schema) and
idempotent; ``upgrade(..., sql=True)`` writes the SQL for a DBA instead.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from pgqueue import validation
from pgqueue._resources import migrations_dir, sql_dir
from pgqueue.commands import command
from pgqueue.config import resolve_dsn
from pgqueue.errors import PermissionDenied
from pgqueue.queries import render

__all__ = ["current", "downgrade", "render_migration", "upgrade"]


def _config(dsn: str | None, schema: str, output: TextIO | None = None):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config(stdout=output or sys.stdout, output_buffer=output or sys.stdout)
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["schema"] = validation.schema_name(schema)
    cfg.attributes["dsn"] = resolve_dsn(dsn)
    return cfg


def upgrade(
    dsn: str | None = None,
    schema: str = "pgqueue",
    revision: str = "head",
    *,
    sql: bool = False,
    output: TextIO | None = None,
) -> str | None:
    """Bring ``schema`` to ``revision``. With ``sql=True`` write the SQL to
    ``output`` (default stdout) instead of running it, and return it."""
    from alembic import command

    if sql:
        buffer = io.StringIO()
        command.upgrade(_config(dsn, schema, buffer), revision, sql=True)
        text = buffer.getvalue()
        (output or sys.stdout).write(text)
        return text
    with _refusal_as_permission_denied(schema, dsn):
        command.upgrade(_config(dsn, schema, output), revision)
        _reapply_grants(dsn, schema)
    return None


def _reapply_grants(dsn: str | None, schema: str) -> None:
    """Grant the roles recorded by ``pgqueue grant`` their kind again, so that
    the objects of the revisions just applied are covered too."""
    from pgqueue.grants import reapply

    reapply(resolve_dsn(dsn), validation.schema_name(schema))


def downgrade(dsn: str | None = None, schema: str = "pgqueue", revision: str = "base") -> None:
    """Take ``schema`` down to ``revision`` (``base``: remove every pgqueue object)."""
    from alembic import command

    with _refusal_as_permission_denied(schema, dsn):
        command.downgrade(_config(dsn, schema), revision)


@contextmanager
def _refusal_as_permission_denied(schema: str, dsn: str | None) -> Iterator[None]:
    """Driver errors come as pgqueue errors; a role that may not migrate gets
    PermissionDenied saying who may."""
    from pgqueue.connection import ErrorTranslator, translated

    hint = (
        "migrations run as the owner of the schema "
        f"(or a member of it, see `{command('grant --admin')}`)"
    )
    from pgqueue.connection import connection_params

    connection_params(resolve_dsn(dsn))  # an unparsable DSN: one line, without its parts
    translate = ErrorTranslator(schema, resolve_dsn(dsn), permission_hint=hint)
    try:
        with translated(translate):
            yield
    except PermissionDenied as exc:
        raise PermissionDenied(f'cannot migrate schema "{schema}": {exc}') from None


def current(dsn: str | None = None, schema: str = "pgqueue") -> str | None:
    """The schema's revision, or None when it was never migrated."""
    from pgqueue.database import read_revision

    return read_revision(resolve_dsn(dsn), validation.schema_name(schema))


def render_migration(filename: str, schema: str) -> str:
    """The SQL of ``sql/<filename>`` (``schema.sql``, ``migrations/...``) for ``schema``."""
    path = sql_dir() / filename
    return render(path.read_text(encoding="utf-8"), validation.schema_name(schema))


def run_migration_file(filename: str) -> None:
    """Run one SQL file of ``sql/`` from inside an Alembic revision.

    Online, the text goes to the driver as is (it holds ``%`` in plpgsql
    format strings that SQLAlchemy or a parameter parser would mangle);
    offline (``--sql``), it is written out.
    """
    from alembic import context, op

    schema = context.config.attributes["schema"]
    text = render_migration(filename, schema)
    if context.is_offline_mode():
        op.get_context().impl.static_output(text.strip() + "\n")
    else:
        from pgqueue.database import run_script

        run_script(op.get_bind().connection.driver_connection, text)  # type: ignore[arg-type]
