"""``pgqueue workflow``: workflows (graphs of jobs that wait for each other)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from pgqueue_cli import output
from pgqueue_cli.context import open_app
from pgqueue_cli.errors import FAILURE, fail
from pgqueue_cli.options import JsonOption, LimitOption

if TYPE_CHECKING:
    from pgqueue.workflow import WorkflowInfo

app = typer.Typer(
    name="workflow",
    help="Workflows: show one step by step, list them, cancel one.",
    no_args_is_help=True,
)

WorkflowId = Annotated[int, typer.Argument(help="The workflow's id.", min=1)]
#: How many workflows of one name `show NAME` lists when it is not unique.
NAMESAKES = 20


@app.command("show")
def show(
    workflow: Annotated[
        str,
        typer.Argument(
            help="The workflow's id, or its name when no other workflow has it.",
            show_default=False,
        ),
    ],
    as_json: JsonOption = False,
) -> None:
    """Show a workflow: each step's job, status and what it waits for.

    A name that several workflows share lists them (id, created, status)
    and fails: show one by its id. Digits are an id.

    Examples:

      pgqueue workflow show 12

      pgqueue workflow show checkout-7
    """
    with open_app() as queue_app:
        if workflow.isascii() and workflow.isdigit():
            info = queue_app.get_workflow(int(workflow))
        else:
            info = _named(queue_app.list_workflows(name=workflow, limit=NAMESAKES), workflow)
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


def _named(found: list[WorkflowInfo], name: str) -> WorkflowInfo:
    """The one workflow of that name; else fail, listing them when several."""
    if not found:
        fail(f"no workflow is named {name!r} (pgqueue workflow list shows them)")
    if len(found) > 1:
        more = " (the newest)" if len(found) == NAMESAKES else ""
        typer.echo(
            f"error: {len(found)}{more} workflows are named {name!r}: "
            f"show one by its id, e.g. pgqueue workflow show {found[0].workflow_id}",
            err=True,
        )
        rows = [(w.workflow_id, w.created_at, w.status) for w in found]
        output.stderr().print(output.table(None, ("id", "created", "status"), rows))
        raise typer.Exit(FAILURE)
    return found[0]


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
