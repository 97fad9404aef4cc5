"""The ASGI application: the route table over the handlers.

Pages are rendered on the server (Jinja2, autoescaped: payloads, errors, task
and queue names are attacker-controlled text); htmx (vendored under
``static/``) swaps the live regions and drives bulk-action progress. The
Content-Security-Policy allows scripts and styles from this origin only.

Where the rest lives: :mod:`.endpoints` (authenticate, map errors, render),
:mod:`.pages` (GET), :mod:`.action_handlers` (POST), :mod:`.login`,
:mod:`.security` (headers, CSRF, redirects), :mod:`.views` (chart, timeline,
template filters), :mod:`.data` (every read), :mod:`.actions` (bulk batches).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from pgqueue.dashboard import action_handlers as do
from pgqueue.dashboard import login, pages
from pgqueue.dashboard.auth import Authorize, Guard
from pgqueue.dashboard.endpoints import Dashboard
from pgqueue.dashboard.security import TOKEN_ENV
from pgqueue.errors import InvalidOption

if TYPE_CHECKING:
    from pgqueue.app import App

HERE = Path(__file__).parent


def create_app(
    app: App,
    *,
    read_only: bool = False,
    authorize: Authorize | None = None,
    token: str | None = None,
    cache_ttl: float = 1.0,
) -> Starlette:
    """The dashboard as an ASGI app, to serve with uvicorn or mount in a host
    (Starlette/FastAPI ``app.mount("/pgqueue", create_app(queue_app))``).

    ``token`` (default: ``PGQUEUE_DASHBOARD_TOKEN``) protects every page and
    allows actions; without one, and without ``authorize``, the dashboard is
    read-only. ``authorize(request, action) -> bool`` (sync or async) lets a
    host decide each action after authenticating the user itself.
    ``cache_ttl``: seconds that browsers share the reads of a page (0: off).
    """
    guard = Guard(
        token if token is not None else os.environ.get(TOKEN_ENV),
        read_only=read_only,
        authorize=authorize,
    )
    if cache_ttl < 0:
        raise InvalidOption(f"cache_ttl must be 0 or more seconds, got {cache_ttl!r}")
    dash = Dashboard(app, guard, cache_ttl)

    # Served on its own, the dashboard closes what it opened on the server's
    # event loop before that loop ends (a pool left open there has tasks the
    # loop's end cancels mid-connect). Mounted in a host, it gets no lifespan
    # events: the host's own shutdown closes the App.
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await dash.close()

    starlette = Starlette(routes=routes(dash), lifespan=lifespan)
    starlette.state.dashboard = dash
    return starlette


def routes(dash: Dashboard) -> list[BaseRoute]:
    """Every URL of the dashboard (stable: bookmarks and scripts use them)."""
    p, a = dash.page, dash.action
    post = ["POST"]
    # Each page, and its JSON twin under /api/ (the overview's is /api/overview).
    read: list[BaseRoute] = []
    for path, api, handler in (
        ("/", "/overview", pages.overview),
        ("/jobs", "/jobs", pages.jobs),
        ("/jobs/{job_id:int}", "/jobs/{job_id:int}", pages.job),
        ("/dead", "/dead", pages.dead),
        ("/queues", "/queues", pages.queues),
        ("/schedules", "/schedules", pages.schedules),
        ("/workers", "/workers", pages.workers),
        ("/tasks", "/tasks", pages.tasks),
        ("/workflows", "/workflows", pages.workflows),
        ("/workflows/{workflow_id:int}", "/workflows/{workflow_id:int}", pages.workflow),
    ):
        read += [Route(path, p(handler)), Route("/api" + api, p(handler))]
    return [
        *read,
        Route("/metrics", p(pages.metrics)),
        Route("/events", p(pages.events)),
        Route("/healthz", dash.public(pages.healthz)),
        Route("/login", dash.public(login.login_form), methods=["GET"]),
        Route("/login", dash.public(login.login), methods=post),
        Route("/logout", dash.public(login.logout), methods=post),
        Route("/actions/jobs/{job_id:int}/cancel", a("cancel", do.job_cancel), methods=post),
        Route("/actions/jobs/{job_id:int}/replay", a("replay", do.job_replay), methods=post),
        Route("/actions/jobs/{job_id:int}/requeue", a("requeue", do.job_requeue), methods=post),
        Route("/actions/jobs", a("bulk", do.bulk), methods=post),
        Route("/actions/dead/requeue", a("requeue_group", do.requeue_group), methods=post),
        Route("/actions/queues/{queue:path}/pause", a("pause", do.queue_pause), methods=post),
        Route("/actions/queues/{queue:path}/resume", a("resume", do.queue_resume), methods=post),
        Route("/actions/queues/{queue:path}/limits", a("limits", do.queue_limits), methods=post),
        Route(
            "/actions/schedules/{name:path}/enable",
            a("schedule_enable", do.schedule_enable),
            methods=post,
        ),
        Route(
            "/actions/schedules/{name:path}/disable",
            a("schedule_disable", do.schedule_disable),
            methods=post,
        ),
        Route(
            "/actions/schedules/{name:path}/run",
            a("schedule_run", do.schedule_run),
            methods=post,
        ),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]


__all__ = ["create_app"]
