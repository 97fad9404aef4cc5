"""``pgqueue serve``: the HTTP API for producers and workers without a
database connection (needs ``pgqueue[http]``).

Starlette and uvicorn are imported only when this command runs.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated

import typer

import pgqueue
from pgqueue_cli import parsing
from pgqueue_cli.asgi import serve as asgi_serve
from pgqueue_cli.context import state
from pgqueue_cli.errors import fail

#: The first descriptor systemd passes (sd_listen_fds(3)).
SD_LISTEN_FDS_START = 3


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
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Open connections at most; past it a new one evicts the oldest idle one "
            "[default: 1000, or less to fit the open-file limit].",
            min=1,
            show_default=False,
        ),
    ] = None,
    header_timeout: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="A connection must finish a request's headers within this, else it is closed.",
        ),
    ] = "10s",
    keep_alive_timeout: Annotated[
        str,
        typer.Option(metavar="DURATION", help="Close a keep-alive connection idle this long."),
    ] = "5s",
    read_timeout: Annotated[
        str,
        typer.Option(metavar="DURATION", help="A request's body must arrive within this (408)."),
    ] = "30s",
    max_requests: Annotated[
        int | None,
        typer.Option(
            help="Requests served at once; past it: 503 busy [default: 1000].",
            min=1,
            show_default=False,
        ),
    ] = None,
    max_long_polls: Annotated[
        int | None,
        typer.Option(
            help="Long polls waiting at once; past it: 503 busy [default: 500].",
            min=1,
            show_default=False,
        ),
    ] = None,
    max_long_polls_per_token: Annotated[
        int | None,
        typer.Option(help="Long polls one token may hold at once; past it: 429.", min=1),
    ] = None,
    rate_limit: Annotated[
        list[str] | None,
        typer.Option(
            "--rate-limit",
            metavar="KIND=COUNT/PERIOD",
            help="Per-token request rate for one kind of request (enqueue, lease, complete, "
            "read, admin), e.g. enqueue=100/1s; repeatable; past it: 429.",
        ),
    ] = None,
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
    reap_seconds = _positive("--reap-interval", reap_interval)
    headers_within = _positive("--header-timeout", header_timeout)
    idle_within = _positive("--keep-alive-timeout", keep_alive_timeout)
    body_within = _positive("--read-timeout", read_timeout)
    rates: dict[str, str] = {}
    for given in rate_limit or []:
        name, sep, rate = given.partition("=")
        if not sep:
            fail(f"--rate-limit {given!r}: use KIND=COUNT/PERIOD, e.g. enqueue=100/1s")
        rates[name.strip()] = rate.strip()
    try:
        import uvicorn  # noqa: F401 (present: asgi.serve runs it)

        from pgqueue.http import Limits, Tokens, create_api, parse_rates
        from pgqueue.http.guard import (
            ACCEPT_BURST,
            AcceptLogLimit,
            ConnectionGuard,
            default_max_connections,
            guarded_protocol,
        )
        from pgqueue.http.limits import DEFAULT_MAX_LONG_POLLS, DEFAULT_MAX_REQUESTS
    except ImportError:
        fail("pgqueue serve needs its extra: pip install 'pgqueue[http]'")
    limits = Limits(
        max_requests=max_requests or DEFAULT_MAX_REQUESTS,
        max_long_polls=max_long_polls or DEFAULT_MAX_LONG_POLLS,
        max_long_polls_per_token=max_long_polls_per_token,
        rates=parse_rates(rates),
    )
    guard = ConnectionGuard(
        max_connections=max_connections or default_max_connections(),
        header_timeout=headers_within,
    )
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
        limits=limits,
        read_timeout=body_within,
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
        http_protocol=lambda base: guarded_protocol(base, guard),
        sockets=systemd_sockets(),
        keep_alive_timeout=idle_within,
        log_filter=AcceptLogLimit(),
        backlog=ACCEPT_BURST,
    )


def systemd_sockets() -> list[socket.socket] | None:
    """The listening sockets systemd passed (socket activation: ``LISTEN_FDS``
    for this process), else None. systemd keeps the socket open across a
    restart, so connections wait in its backlog instead of being refused."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for child processes
    if count < 1:
        return None
    return [socket.socket(fileno=SD_LISTEN_FDS_START + n) for n in range(count)]


def _positive(option: str, text: str) -> float:
    seconds = parsing.duration(option, text).total_seconds()
    if seconds <= 0:
        fail(f"{option} must be longer than 0s")
    return seconds
