"""Serving an ASGI app of pgqueue (``pgqueue dashboard``, ``pgqueue serve``)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

import typer

import pgqueue

#: Seconds a server waits for requests in flight when asked to stop, before
#: uvicorn cancels them (a 500 and a logged traceback each).
GRACEFUL_SHUTDOWN = 5


def serve(
    asgi: Any,
    application: pgqueue.App,
    *,
    host: str,
    port: int,
    log_level: str,
    banner: str,
    on_shutdown: Callable[[], None] | None = None,
    http_protocol: Callable[[type[Any]], type[Any]] | None = None,
    keep_alive_timeout: float = 5.0,
    log_filter: logging.Filter | None = None,
    backlog: int = 2048,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Run ``asgi`` with uvicorn until stopped, after printing ``banner``
    (``{url}`` stands for its address) on stderr; close ``application`` after.

    ``on_shutdown`` runs on the server's event loop as soon as it is asked to
    stop (SIGTERM, Ctrl-C), before it waits for the requests in flight: what
    waits with no end of its own (a long poll) ends there, or uvicorn
    cancels it after ``GRACEFUL_SHUTDOWN`` seconds. ``http_protocol`` wraps
    uvicorn's HTTP protocol class (connection limits); ``log_filter`` is
    put on the loggers that report failing accepts. ``sockets``: listen on
    these (systemd socket activation) instead of binding ``host:port``."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Server(uvicorn.Server):
        async def shutdown(self, *args: Any, **kwargs: Any) -> None:
            if on_shutdown is not None:
                on_shutdown()
            await super().shutdown(*args, **kwargs)

    if sockets:
        host, port = sockets[0].getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    typer.echo(banner.format(url=f"http://{shown}:{port}"), err=True)
    config = uvicorn.Config(
        asgi,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
        timeout_keep_alive=keep_alive_timeout,  # type: ignore[arg-type]
        backlog=backlog,
        http=http_protocol(AutoHTTPProtocol) if http_protocol is not None else "auto",
    )
    if log_filter is not None:
        for name in ("asyncio", "uvicorn.error"):
            logging.getLogger(name).addFilter(log_filter)
    server = Server(config)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # a second Ctrl-C: stopped, as uvicorn.run does
        pass
    finally:
        application.close()
    if not server.started:  # it could not bind or start: uvicorn logged why
        raise typer.Exit(3)
