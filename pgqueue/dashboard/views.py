"""What the pages show, computed without a request: the template
environment and its filters, the throughput chart, a job's timeline.

Pure functions of their arguments, so each is tested without a server.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from pgqueue.explain import fmt_span

if TYPE_CHECKING:
    from pgqueue.dashboard.data import JobFilter, Throughput
    from pgqueue.models import Job

TEMPLATES = Path(__file__).parent / "templates"

NAV = (
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/workflows", "Workflows"),
    ("/dead", "Dead letters"),
    ("/queues", "Queues"),
    ("/schedules", "Schedules"),
    ("/workers", "Workers"),
    ("/tasks", "Tasks"),
)


def age(seconds: float | None) -> str:
    """An age such as ``3m 20s`` (``—`` when unknown)."""
    if seconds is None:
        return "—"
    return fmt_span(max(0.0, float(seconds)))


def when(value: datetime | None) -> str:
    """A time in UTC, to the second."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty(value: Any) -> str:
    """Indented JSON of a payload or result (its repr when not JSON)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def secs(value: float | None) -> str:
    """A duration: milliseconds below a second."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    # A wait can come out below zero only from rows written by hand (a job
    # started before its run_at): show it as none.
    value = max(0.0, float(value))
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return fmt_span(value)


def environment() -> Environment:
    """The Jinja2 environment of the pages (autoescaped: payloads, errors,
    task and queue names are attacker-controlled text)."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=age, when=when, pretty=pretty, percent=percent, secs=secs)
    return env


def chart(throughput: Throughput) -> dict[str, Any]:
    """Bars of an inline SVG: one per minute, succeeded stacked under dead;
    estimated minutes (more finished jobs than the per-minute count reads)
    are marked ``≈``."""
    points = throughput.minutes
    peak = max((p.succeeded + p.dead for p in points), default=0) or 1
    width, height, bar = 600, 120, 10
    bars = []
    for i, p in enumerate(points):
        h_ok = round(height * p.succeeded / peak)
        h_dead = round(height * p.dead / peak)
        ok = ("≈" if p.succeeded_estimated else "") + str(p.succeeded)
        dead = ("≈" if p.dead_estimated else "") + str(p.dead)
        bars.append(
            {
                "x": i * bar,
                "ok_y": height - h_ok,
                "ok_h": h_ok,
                "dead_y": height - h_ok - h_dead,
                "dead_h": h_dead,
                "label": f"{datetime.fromtimestamp(p.minute, UTC):%H:%M}: "
                f"{ok} succeeded, {dead} dead",
            }
        )
    return {
        "bars": bars,
        "width": width,
        "height": height,
        "bar": bar - 2,
        "peak": peak,
        "estimated": any(p.estimated for p in points),
        "totals_estimated": throughput.succeeded.estimated or throughput.dead.estimated,
        "succeeded": throughput.succeeded,
        "dead": throughput.dead,
        "hour_cap": throughput.hour_cap,
    }


def timeline(job: Job) -> list[tuple[datetime, str]]:
    """A job's life in order: created, due, each attempt, finished."""
    events: list[tuple[datetime, str]] = [(job.created_at, "created")]
    if job.run_at != job.created_at:
        events.append((job.run_at, "due (run_at)"))
    for attempt in job.attempt_history or []:
        events.append(
            (
                attempt.started_at,
                f"attempt {attempt.attempt} started"
                + (f" on {attempt.worker_id}" if attempt.worker_id else ""),
            )
        )
        if attempt.finished_at is not None:
            events.append((attempt.finished_at, f"attempt {attempt.attempt}: {attempt.outcome}"))
    if job.finished_at is not None:
        events.append((job.finished_at, f"finished: {job.status}"))
    return sorted(events, key=lambda e: e[0])


def describe(flt: JobFilter) -> str:
    """A filter in words, for the messages of bulk actions."""
    parts = [f"{k}={v}" for k, v in flt.params().items()]
    return ", ".join(parts) or "no filter (every job)"
