"""Options shared by several commands, declared once so they read the same everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print JSON with the field names of pgqueue's types."),
]
QuietOption = Annotated[
    bool,
    typer.Option("--quiet", help="Print nothing on success (for cron); errors still go to stderr."),
]
ProgressOption = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress",
        help="Show a progress bar on stderr (default: only when stderr is a terminal).",
        show_default=False,
    ),
]
QueueFilter = Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")]
TaskFilter = Annotated[str | None, typer.Option("--task", "-t", help="Only this task name.")]
LimitOption = Annotated[
    int, typer.Option("--limit", "-n", help="Most jobs per page.", min=1, max=10_000)
]
CursorOption = Annotated[
    str | None,
    typer.Option(help="Continue after the page that printed this cursor (keyset pagination)."),
]
YesOption = Annotated[
    bool,
    typer.Option("--yes", "-y", help="Do it without asking (needed when stdin is not a terminal)."),
]
