"""``pgqueue workflow``: workflows (graphs of jobs that wait for each other)."""

from __future__ import annotations

from typing import Annotated

import typer

from pgqueue_cli import output
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption, LimitOption

app = typer.Typer(
    name="workflow",
    help="Workflows: show one step by step, list them, cancel one.",
    no_args_is_help=True,
)

WorkflowId = Annotated[int, typer.Argument(help="The workflow's id.", min=1)]


@app.command("show")
def show(workflow_id: WorkflowId, as_json: JsonOption = False) -> None:
    """Show a workflow: each step's job, status and what it waits for.

    Examples:

      pgqueue workflow show 12
    """
    with open_app() as queue_app:
        info = queue_app.get_workflow(workflow_id)
    if as_json:
        output.print_json(info)
        return
    rows = [
        (name, job.id, job.task, job.status.value, ", ".join(info.after[name]) or "-")
        for name, job in info.steps.items()
    ]
    output.stdout().print(
        output.table(
            f"workflow {info.workflow_id} {info.name!r}: {info.status}",
            ("step", "job", "task", "status", "after"),
            rows,
        )
    )


@app.command("list")
def list_workflows(
    status: Annotated[
        str | None, typer.Option("--status", "-s", help="running, succeeded or failed.")
    ] = None,
    limit: LimitOption = 50,
    as_json: JsonOption = False,
) -> None:
    """List workflows, newest first.

    Examples:

      pgqueue workflow list --status running
    """
    with open_app() as queue_app:
        found = queue_app.list_workflows(status=status, limit=limit)
    if as_json:
        output.print_json(found)
        return
    rows = [(w.workflow_id, w.name, w.status, len(w.steps), w.created_at) for w in found]
    output.stdout().print(output.table(None, ("id", "name", "status", "steps", "created"), rows))
    if not found:
        output.hint("no workflows match")


@app.command("cancel")
def cancel(workflow_id: WorkflowId, as_json: JsonOption = False) -> None:
    """Cancel a workflow's live steps (running ones are asked to stop).

    Examples:

      pgqueue workflow cancel 12
    """
    with open_app() as queue_app:
        count = queue_app.cancel_workflow(workflow_id)
    if as_json:
        output.print_json({"workflow_id": workflow_id, "cancelled": count})
    else:
        output.info(f"workflow {workflow_id}: {count} step{'s' if count != 1 else ''} cancelled")
