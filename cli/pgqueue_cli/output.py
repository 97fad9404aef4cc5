"""Everything the commands print: JSON, rich tables, progress bars, messages.

Data goes to stdout (tables, JSON); progress bars, hints and errors go to
stderr, so that ``pgqueue ... --json | jq`` and cron mails stay clean.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from pgqueue.explain import fmt_span
from pgqueue.jsonable import to_jsonable as to_jsonable  # re-exported: the commands use it


def stdout() -> Console:
    """A console on the current stdout (looked up per call: tests swap sys.stdout)."""
    # Off a terminal, rich would wrap at 80 columns (or COLUMNS); piped output
    # is never wrapped: each table row stays on one line for grep and awk.
    if sys.stdout.isatty():
        return Console(file=sys.stdout, soft_wrap=False)
    return Console(file=sys.stdout, soft_wrap=True, width=UNWRAPPED_WIDTH)


#: The console width off a terminal: wider than any row, so nothing wraps.
UNWRAPPED_WIDTH = 1_000_000


def stderr() -> Console:
    return Console(file=sys.stderr, soft_wrap=True)


# --- JSON --------------------------------------------------------------------


def print_json(value: Any, *, compact: bool = False) -> None:
    """Write ``value`` as JSON to stdout (compact: one line, for JSON lines)."""
    text = json.dumps(
        to_jsonable(value), ensure_ascii=False, indent=None if compact else 2, sort_keys=False
    )
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# --- human output ------------------------------------------------------------


def info(message: str) -> None:
    """A line for humans on stdout (totals, confirmations)."""
    lines = (printable(line) for line in message.split("\n"))
    stdout().print("\n".join(lines), markup=False, highlight=False)


def hint(message: str) -> None:
    """A side note on stderr (next page, what to run next)."""
    stderr().print(message, markup=False, highlight=False, style="dim")


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A plain table; numbers right-aligned by column name convention."""
    result = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", highlight=False)
    for name in columns:
        numeric = name in NUMERIC_COLUMNS
        result.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        result.add_row(*(cell(v) for v in row))
    return result


NUMERIC_COLUMNS = frozenset(
    {
        "id",
        "queued",
        "scheduled",
        "running",
        "dead",
        "done/1h",
        "priority",
        "attempts",
        "#",
        "attempt id",
        "latency",
        "live",
        "dead before",
        "dead after",
        "size",
        "oldest ready",
    }
)


# C0 and C1 control characters (escape sequences, line breaks, BEL): a stored
# task name, queue name or error must never drive the operator's terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters shown as escapes (``\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def cell(value: Any) -> str:
    """A table cell: times as UTC, None as a dash, control characters escaped."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return printable(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return printable(str(value))


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_age(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_span(seconds)


def fmt_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{size}B"  # pragma: no cover - the loop always returns


def shorten(text: str | None, width: int = 60) -> str | None:
    """One line of at most ``width`` characters."""
    if text is None:
        return None
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# --- progress ------------------------------------------------------------------


def progress_wanted(choice: bool | None, *, quiet: bool, as_json: bool) -> bool:
    """``--progress/--no-progress`` when given, else only on a terminal, never
    with --quiet or --json (cron and pipes get clean output)."""
    if quiet or as_json:
        return bool(choice)
    return sys.stderr.isatty() if choice is None else choice


@contextmanager
def progress(description: str, total: int | None, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr; yields ``advance(n)``. A no-op when disabled."""
    if not enabled:
        yield _ignore
        return
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr(),
    )
    with bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def _ignore(_: int) -> None:
    return None
