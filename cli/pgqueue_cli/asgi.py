"""Serving an ASGI app of pgqueue (``pgqueue dashboard``, ``pgqueue serve``)."""

from __future__ import annotations

from typing import Any

import typer

import pgqueue


def serve(
    asgi: Any, application: pgqueue.App, *, host: str, port: int, log_level: str, banner: str
) -> None:
    """Run ``asgi`` with uvicorn until stopped, after printing ``banner``
    (``{url}`` stands for its address) on stderr; close ``application`` after."""
    import uvicorn

    shown = f"[{host}]" if ":" in host else host
    typer.echo(banner.format(url=f"http://{shown}:{port}"), err=True)
    try:
        # Event streams and long polls end only with their wait: 5 s on shutdown.
        uvicorn.run(
            asgi,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    finally:
        application.close()
