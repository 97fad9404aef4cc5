"""``pgqueue serve``: the HTTP API for producers and workers without a
database connection (needs ``pgqueue[http]``).

Starlette and uvicorn are imported only when this command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import pgqueue
from pgqueue_cli import parsing
from pgqueue_cli.asgi import serve as asgi_serve
from pgqueue_cli.context import state
from pgqueue_cli.errors import fail


def serve(
    tokens: Annotated[
        Path,
        typer.Option(
            "--tokens",
            help="Token file: one 'KIND TOKEN_SHA256' per line (producer, worker, admin).",
            envvar="PGQUEUE_HTTP_TOKENS",
        ),
    ],
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8485,
    producer_role: Annotated[
        str | None,
        typer.Option(help="Database role of producer tokens (default: the one granted)."),
    ] = None,
    worker_role: Annotated[
        str | None,
        typer.Option(help="Database role of worker tokens (default: the one granted)."),
    ] = None,
    admin_role: Annotated[
        str | None,
        typer.Option(help="Database role of admin tokens (default: the one granted)."),
    ] = None,
    max_body: Annotated[
        int, typer.Option(help="Largest request body in bytes (larger: 413).", min=1024)
    ] = 1 << 20,
    max_wait: Annotated[
        float, typer.Option(help="Longest long-poll a lease may ask for, in seconds.", min=0)
    ] = 20.0,
    poll_interval: Annotated[
        float,
        typer.Option(
            help="How often a waiting long-poll looks again without a notification "
            "(jobs that become due later), in seconds.",
            min=0.1,
        ),
    ] = 2.0,
    pool_size: Annotated[int, typer.Option(help="Database connections of the pool.", min=1)] = 10,
    reaper: Annotated[
        bool,
        typer.Option(
            "--reaper/--no-reaper",
            help="Reclaim the jobs of workers whose lease expired, as workers do "
            "(a fleet of HTTP workers only needs it).",
        ),
    ] = True,
    maintenance: Annotated[
        bool,
        typer.Option(
            "--maintenance/--no-maintenance",
            help="Take part in the fleet's maintenance (one process at a time applies "
            "`pgqueue retention`).",
        ),
    ] = True,
    reap_interval: Annotated[
        str, typer.Option(metavar="DURATION", help="Time between reaper runs, e.g. 5s.")
    ] = "5s",
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve the HTTP API: enqueue, lease, ack, fail, nack, extend, inspect.

    Tokens go in Authorization: Bearer <token>; the file holds their sha256
    (e.g. printf %s "$TOKEN" | sha256sum). Each kind runs as the database
    role `pgqueue grant` recorded for it, unless --producer-role & co. say.

    Examples:

      pgqueue serve --tokens /etc/pgqueue/tokens

      pgqueue serve --host 0.0.0.0 --port 9000 --tokens tokens --worker-role http_worker
    """
    try:
        import uvicorn  # noqa: F401 (present: asgi.serve runs it)

        from pgqueue.http import Tokens, create_api
    except ImportError:
        fail("pgqueue serve needs its extra: pip install 'pgqueue[http]'")
    reap_seconds = parsing.duration("--reap-interval", reap_interval).total_seconds()
    if reap_seconds <= 0:
        fail("--reap-interval must be longer than 0s")
    parsed = Tokens.from_file(tokens)
    if not len(parsed):
        fail(f"{tokens}: no tokens (lines 'KIND TOKEN_SHA256')")
    application = pgqueue.App(
        dsn=state.dsn, schema=state.schema, pool_min_size=0, pooler=state.pooler
    )
    report = application.check()
    blocking = [c for c in report.checks if not c.ok and c.name in ("connection", "schema")]
    if blocking:
        application.close()
        fail(blocking[0].message)
    asgi = create_api(
        application,
        parsed,
        producer_role=producer_role,
        worker_role=worker_role,
        admin_role=admin_role,
        max_body_bytes=max_body,
        pool_max_size=pool_size,
        max_wait=max_wait,
        poll_interval=poll_interval,
        reaper=reaper,
        maintenance=maintenance,
        reap_interval=reap_seconds,
    )
    from pgqueue.logs import configure_logging

    configure_logging(log_level)
    kinds = ", ".join(sorted(parsed.kinds))
    asgi_serve(
        asgi,
        application,
        host=host,
        port=port,
        log_level=log_level,
        banner=f"pgqueue HTTP API on {{url}}/v1/ (tokens: {kinds})",
        # Held long polls answer {"jobs": []} at once; other requests finish.
        on_shutdown=asgi.state.api.stop_waiting,
    )
