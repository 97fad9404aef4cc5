"""``pgqueue dashboard``: serve the web dashboard (needs ``pgqueue[dashboard]``).

Starlette, Jinja2 and uvicorn are imported only when this command runs, so
the rest of the CLI works without the extra.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

import pgqueue
from pgqueue_cli.asgi import serve as asgi_serve
from pgqueue_cli.context import state
from pgqueue_cli.errors import fail

TOKEN_ENV = "PGQUEUE_DASHBOARD_TOKEN"


def _base_path(value: str) -> str:
    value = "/" + value.strip("/")
    if any(c in value for c in "?#\\ ") or "//" in value:
        fail(f"--base-path must be a URL path like /pgqueue, got {value!r}")
    return "" if value == "/" else value


def dashboard(
    host: Annotated[
        str, typer.Option(help="Address to bind (other hosts need e.g. 0.0.0.0 and a token).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8484,
    base_path: Annotated[
        str, typer.Option(help="URL prefix when served behind a proxy, e.g. /pgqueue.")
    ] = "/",
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Refuse every action, even with a token.")
    ] = False,
    app_path: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="PGQUEUE_APP",
            help="Your App (pkg.module:app), to show its registered tasks' settings.",
        ),
    ] = None,
    cache_ttl: Annotated[
        float,
        typer.Option(help="Seconds that browsers share a page's database reads (0: off).", min=0),
    ] = 1.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the web dashboard: queues, jobs, dead letters, schedules, workers, tasks.

    Actions (cancel, replay, requeue, pause, limits, schedules) need a token
    in PGQUEUE_DASHBOARD_TOKEN; without one the dashboard is read-only.

    Examples:

      pgqueue dashboard

      PGQUEUE_DASHBOARD_TOKEN=s3cret pgqueue dashboard --port 9000 --base-path /pgqueue
    """
    try:
        import uvicorn  # noqa: F401 (present: asgi.serve runs it)
        from starlette.applications import Starlette
        from starlette.routing import Mount

        from pgqueue.dashboard import create_app
    except ImportError:
        fail("the dashboard needs its extra: pip install 'pgqueue[dashboard]'")
    prefix = _base_path(base_path)
    if app_path:
        from pgqueue_cli.apps import load_app

        application = load_app(app_path)
    else:
        application = pgqueue.App(dsn=state.dsn, schema=state.schema, pool_min_size=0)
    # Refuse to start on a database it cannot use, with the reason, rather
    # than serve error pages.
    report = application.check()
    blocking = [c for c in report.checks if not c.ok and c.name in ("connection", "schema")]
    if blocking:
        application.close()
        fail(blocking[0].message)
    asgi: Any = create_app(application, read_only=read_only, cache_ttl=cache_ttl)
    if prefix:
        asgi = Starlette(routes=[Mount(prefix, app=asgi)])
    from pgqueue.logs import configure_logging

    configure_logging(log_level)
    mode = "read-only" if read_only or not os.environ.get(TOKEN_ENV) else "actions need the token"
    if host not in ("127.0.0.1", "::1", "localhost") and not os.environ.get(TOKEN_ENV):
        typer.echo(
            f"warning: serving on {host} without {TOKEN_ENV}: anyone who reaches this port "
            "can read every payload and error (actions stay disabled)",
            err=True,
        )
    asgi_serve(
        asgi,
        application,
        host=host,
        port=port,
        log_level=log_level,
        banner=f"pgqueue dashboard on {{url}}{prefix}/ ({mode})",
    )
