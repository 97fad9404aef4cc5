"""How the CLI fails: one line on stderr, a non-zero exit code, no traceback
for the errors an operator can fix (input, connection, schema, job state)."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from pgqueue.commands import invoked_as
from pgqueue.errors import PgQueueError

#: Exit code of every expected failure (usage errors keep Typer's 2).
FAILURE = 1


def one_line(error: BaseException | str) -> str:
    """The message on one line (libpq's messages span several)."""
    return " ".join(str(error).split())


def fail(message: str, code: int = FAILURE) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with ``code``."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(code)


class PgQueueGroup(TyperGroup):
    """The root command group: every subcommand (``schedule`` included) runs
    inside its ``invoke``, so this one place turns pgqueue's exceptions into
    one-line errors, both for the console script and for ``CliRunner``."""

    def invoke(self, ctx: Any) -> Any:
        # Hints name the program as invoked (`manage.py pgqueue dlq requeue 9`).
        try:
            with invoked_as(ctx.info_name):
                return super().invoke(ctx)
        except PgQueueError as exc:
            # The library's database layer translates every database error
            # (pgqueue.connection.ErrorTranslator): nothing here names psycopg.
            fail(str(exc))
