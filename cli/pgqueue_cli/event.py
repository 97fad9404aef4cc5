"""``pgqueue event``: send an event to the jobs that wait for it."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from pgqueue.errors import InvalidPayload
from pgqueue_cli import output
from pgqueue_cli.context import open_app
from pgqueue_cli.options import JsonOption

app = typer.Typer(
    name="event",
    help="Events of durable tasks: send one to the jobs waiting for it.",
    no_args_is_help=True,
)


@app.command("send")
def send(
    key: Annotated[str, typer.Argument(help="The event's key.", show_default=False)],
    payload: Annotated[
        str | None,
        typer.Option("--payload", help="The event's payload: any JSON value.", metavar="JSON"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Send an event: every job waiting for KEY in context.wait_for_event() is
    released, and a job that waits for it later gets it at once.

    Examples:

      pgqueue event send paid:acc-1

      pgqueue event send paid:acc-1 --payload '{"plan": "pro"}'
    """
    value = None if payload is None else _json(payload)
    with open_app() as queue_app:
        released = queue_app.send_event(key, value)
    if as_json:
        output.print_json({"key": key, "released": released})
        return
    output.info(
        f"sent event {key!r}: released {released} waiting job{'s' if released != 1 else ''}"
    )


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidPayload(f"--payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidPayload("--payload nests arrays/objects too deeply") from None
