"""structlog setup for the worker and the CLI: console lines on a TTY, JSON otherwise."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from pgqueue.errors import InvalidOption
from pgqueue.telemetry import tracing

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def configure_logging(
    level: str = "info", fmt: str = "auto", stream: TextIO | None = None, *, cache: bool = True
) -> None:
    """Send pgqueue's (and psycopg's) logs to ``stream`` (stderr) at ``level``,
    rendered for humans (``console``) or machines (``json``); ``auto`` picks
    console on a TTY. ``cache``: loggers keep this configuration for good
    (faster; for a process that is only a worker)."""
    out = stream or sys.stderr
    if level.lower() not in LEVELS:
        raise InvalidOption(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    number = LEVELS[level.lower()]
    console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=out.isatty())
        if console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *([tracing.add_trace_id] if tracing.installed() else []),
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            *([] if console else [structlog.processors.format_exc_info]),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=cache,
    )
    # Libraries that log through the standard library (psycopg_pool) go to the same stream.
    logging.basicConfig(
        stream=out,
        level=max(number, logging.WARNING),
        format="%(levelname)s %(name)s: %(message)s",
        force=True,
    )
