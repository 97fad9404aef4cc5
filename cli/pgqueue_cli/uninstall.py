"""``pgqueue uninstall``: drop the pgqueue schema and everything in it."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue.connection import describe_target
from pgqueue.errors import InvalidJobState
from pgqueue_cli import output
from pgqueue_cli.bulk import confirm
from pgqueue_cli.context import open_app, state
from pgqueue_cli.options import JsonOption, YesOption


def uninstall(
    force: Annotated[
        bool,
        typer.Option("--force", help="Drop it even while workers are alive or jobs are live."),
    ] = False,
    yes: YesOption = False,
    as_json: JsonOption = False,
) -> None:
    """Drop the pgqueue schema: every job, result, schedule and setting in it.

    Says what it would drop and asks first (--yes to skip). Refused while a
    worker sent a heartbeat in the last minute or jobs are queued or running,
    unless --force. Run `pgqueue migrate` to start again. With --json:
    {"schema", "dropped": true, "jobs", "archived_jobs"}.

    Examples:

      pgqueue uninstall

      pgqueue --schema pgqueue_example uninstall --yes
    """
    with open_app() as app:
        where = f'schema "{app.schema}" in {describe_target(app.dsn)}'
        summary = app.schema_summary()
        if not force and (summary["live_workers"] or summary["live_jobs"]):
            raise InvalidJobState(
                f"{where} has {summary['live_workers']} live workers and "
                f"{summary['live_jobs']} queued or running jobs: stop the workers first, "
                "or pass --force"
            )
        confirm(
            f"Drop {where} with {summary['jobs']} jobs and {summary['archived_jobs']} "
            "archived jobs?",
            yes,
        )
        app.uninstall()
    if as_json:
        output.print_json(
            {
                "schema": state.schema,
                "dropped": True,
                "jobs": summary["jobs"],
                "archived_jobs": summary["archived_jobs"],
            }
        )
    else:
        output.info(f"dropped {where}")
