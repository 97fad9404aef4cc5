"""The GET handlers: every page, its JSON twin under ``/api/``, the
Prometheus text, the health probe and the live-update stream.

Each handler takes the :class:`~pgqueue.dashboard.endpoints.Dashboard` and
the request; the HTML and the JSON answer of a page come from one read.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from pgqueue.dashboard.data import (
    COUNT_CAP,
    DEAD_GROUP_SAMPLE,
    SEARCH_WINDOW,
    TASK_STATS_SAMPLE,
    TASK_STATS_WINDOW,
    THROUGHPUT_PER_MINUTE,
    JobFilter,
    visible_statuses,
)
from pgqueue.dashboard.endpoints import Dashboard
from pgqueue.dashboard.forms import job_id_of
from pgqueue.dashboard.views import chart, pretty, timeline
from pgqueue.errors import PgQueueError
from pgqueue.jsonable import job_jsonable, to_jsonable


async def overview(dash: Dashboard, request: Request) -> Response:
    """``/``: per-queue counts and the last hour's throughput."""
    queues, throughput = await asyncio.gather(dash.data.queues(), dash.data.throughput())
    if dash.wants_json(request):
        return JSONResponse(
            {
                "queues": [q.as_json() for q in queues],
                "throughput": [
                    {
                        "minute": datetime.fromtimestamp(m.minute, UTC).isoformat(),
                        "succeeded": m.succeeded,
                        "dead": m.dead,
                        "estimated": m.estimated,
                    }
                    for m in throughput.minutes
                ],
                "totals": {
                    "succeeded": throughput.succeeded.as_json(),
                    "dead": throughput.dead.as_json(),
                },
            }
        )
    return dash.render(
        request,
        "overview.html",
        queues=queues,
        chart=chart(throughput),
        cap=COUNT_CAP,
        per_minute=THROUGHPUT_PER_MINUTE,
    )


async def jobs(dash: Dashboard, request: Request) -> Response:
    """``/jobs``: a keyset page of jobs, filtered or searched."""
    flt = JobFilter.parse(request.query_params)
    cursor = request.query_params.get("cursor") or None
    page = await dash.data.jobs(flt, cursor)
    if dash.wants_json(request):
        return dash.json({"jobs": page.jobs, "next_cursor": page.next_cursor})
    queue_names = await dash.data.queue_names()
    return dash.render(
        request,
        "jobs.html",
        page=page,
        filter=flt,
        statuses=visible_statuses(),
        queue_names=queue_names,
        window=SEARCH_WINDOW,
        cursor=cursor,
        searching=flt.q is not None or flt.status is None,
    )


async def job(dash: Dashboard, request: Request) -> Response:
    """``/jobs/<id>``: one job, its attempts and why it waits."""
    record, explanation = await dash.data.job(job_id_of(request))
    if dash.wants_json(request):
        # A dashboard viewer holds no lease: the running attempt's token stays hidden.
        return JSONResponse(job_jsonable(record))
    return dash.render(
        request,
        "job.html",
        job=record,
        explanation=explanation,
        timeline=timeline(record),
        payload_text=pretty(record.payload),
        result_text=pretty(record.result),
    )


async def dead(dash: Dashboard, request: Request) -> Response:
    """``/dead``: dead jobs grouped by task, error code and message."""
    groups, capped = await dash.data.dead_groups()
    if dash.wants_json(request):
        return dash.json(
            {
                "groups": [{**to_jsonable(g), "key": g.key} for g in groups],
                "sampled": DEAD_GROUP_SAMPLE if capped else None,
            }
        )
    return dash.render(request, "dead.html", groups=groups, capped=capped, sample=DEAD_GROUP_SAMPLE)


async def queues(dash: Dashboard, request: Request) -> Response:
    """``/queues``: the page shows live counts only; the API answers like
    ``pgqueue status --json``."""
    rows = await dash.data.queues(finished=dash.wants_json(request))
    if dash.wants_json(request):
        return JSONResponse([q.as_json() for q in rows])
    return dash.render(request, "queues.html", queues=rows)


async def schedules(dash: Dashboard, request: Request) -> Response:
    items = await dash.app.list_schedules_async()
    if dash.wants_json(request):
        return dash.json(items)
    return dash.render(request, "schedules.html", schedules=items)


async def workers(dash: Dashboard, request: Request) -> Response:
    rows = await dash.data.workers()
    if dash.wants_json(request):
        return dash.json(rows)
    return dash.render(request, "workers.html", workers=rows)


async def tasks(dash: Dashboard, request: Request) -> Response:
    """``/tasks``: per-task run statistics over a bounded window."""
    found = await dash.data.tasks()
    if dash.wants_json(request):
        return dash.json(found.as_json())
    return dash.render(
        request,
        "tasks.html",
        tasks=found.rows,
        window_start=found.window_start,
        sampled=found.sampled,
        sample=TASK_STATS_SAMPLE,
        window=TASK_STATS_WINDOW,
    )


async def metrics(dash: Dashboard, request: Request) -> Response:
    """The database view of ``pgqueue metrics`` (capped counts, estimates beyond)."""
    return PlainTextResponse(
        await dash.app.metrics_text_async(), media_type="text/plain; version=0.0.4"
    )


async def healthz(dash: Dashboard, request: Request) -> Response:
    """200 when the database is reachable and migrated; no login needed."""
    try:
        report = await dash.app.check_async()
    except PgQueueError as exc:
        return JSONResponse({"ok": False, "error": str(exc)}, status_code=503)
    # The dashboard is healthy when it reaches a migrated schema; queue
    # backlogs and stuck jobs are shown on its pages, not a reason to restart it.
    ok = report.server_version is not None and (report.schema_revision == report.expected_revision)
    return JSONResponse(
        {"ok": ok, "schema_revision": report.schema_revision, "queues_ok": report.ok},
        status_code=200 if ok else 503,
    )


async def events(dash: Dashboard, request: Request) -> Response:
    """Server-sent events: which parts of the pages changed (from LISTEN/NOTIFY)."""
    queue = dash.live.subscribe()
    try:
        # The stream opens (the browser's "open") once the hub listens, so a
        # change made after that is never taken for the state it started from.
        # A database that does not answer delays the stream no longer than this.
        await dash.live.wait_ready(timeout=5.0)
    except BaseException:
        dash.live.unsubscribe(queue)
        raise

    async def stream() -> Any:
        try:
            yield "retry: 3000\n\n"
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=15.0)
                    yield f"event: {event}\ndata: {int(time.time())}\n\n"
                except TimeoutError:
                    yield ": keep-alive\n\n"
        finally:
            dash.live.unsubscribe(queue)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


async def workflows(dash: Dashboard, request: Request) -> Response:
    """``/workflows``: workflows, newest first (``?status=running|succeeded|failed``)."""
    status = request.query_params.get("status") or None
    found = await dash.data.workflows(status)
    if dash.wants_json(request):
        return dash.json({"workflows": found})
    return dash.render(request, "workflows.html", workflows=found, status=status)


async def workflow(dash: Dashboard, request: Request) -> Response:
    """``/workflows/<id>``: the graph, each step with its status and job."""
    info = await dash.data.workflow(int(request.path_params["workflow_id"]))
    if dash.wants_json(request):
        return dash.json(info)
    return dash.render(request, "workflow.html", workflow=info, levels=graph_levels(info.after))


def graph_levels(after: dict[str, list[str]]) -> list[list[str]]:
    """The steps in rows: each after every step it waits for (a layered
    drawing of the graph; ``after`` only names earlier steps)."""
    depth: dict[str, int] = {}
    for name in after:  # insertion order: dependencies come first
        depth[name] = 1 + max((depth.get(p, 0) for p in after[name]), default=-1)
    levels: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for name, d in depth.items():
        levels[d].append(name)
    return levels
