"""Serving an ASGI app of pgqueue (``pgqueue dashboard``, ``pgqueue serve``)."""

from __future__ import annotations

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
) -> None:
    """Run ``asgi`` with uvicorn until stopped, after printing ``banner``
    (``{url}`` stands for its address) on stderr; close ``application`` after.

    ``on_shutdown`` runs on the server's event loop as soon as it is asked to
    stop (SIGTERM, Ctrl-C), before it waits for the requests in flight: what
    waits with no end of its own (a long poll) ends there, or uvicorn
    cancels it after ``GRACEFUL_SHUTDOWN`` seconds."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, *args: Any, **kwargs: Any) -> None:
            if on_shutdown is not None:
                on_shutdown()
            await super().shutdown(*args, **kwargs)

    shown = f"[{host}]" if ":" in host else host
    typer.echo(banner.format(url=f"http://{shown}:{port}"), err=True)
    config = uvicorn.Config(
        asgi,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
    )
    server = Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # a second Ctrl-C: stopped, as uvicorn.run does
        pass
    finally:
        application.close()
    if not server.started:  # it could not bind or start: uvicorn logged why
        raise typer.Exit(3)
