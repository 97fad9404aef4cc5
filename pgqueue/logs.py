"""structlog setup for the worker and the CLI: console lines on a TTY, JSON
otherwise. The standard library's logging is left to the host application
when it configured it (Django does, by default)."""

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
    """Send pgqueue's logs to ``stream`` (stderr) at ``level``, rendered for
    humans (``console``) or machines (``json``); ``auto`` picks console on a
    TTY. Records of the standard library's logging (psycopg's) go there too,
    unless the host application configured logging (then its handlers alone
    decide). ``cache``: loggers keep this configuration for good
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
    _configure_stdlib(out, max(number, logging.WARNING))


#: The name of the root handler pgqueue adds (replaced, never duplicated, by
#: the next configure_logging).
HANDLER_NAME = "pgqueue"


def _configure_stdlib(stream: TextIO, level: int) -> None:
    """Libraries that log through the standard library (psycopg_pool,
    pgqueue.http) go to ``stream`` too, through a root handler of pgqueue's,
    unless the host application configured logging itself: a library must
    not change that (Django's handlers would print each of their records a
    second time through a root handler added beside them)."""
    root = logging.getLogger()
    if host_configured_logging():
        return
    for handler in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)


def host_configured_logging() -> bool:
    """Whether a handler other than pgqueue's (and other than a library's
    NullHandler) is on the root logger or any other."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return any(
        handler.get_name() != HANDLER_NAME and not isinstance(handler, logging.NullHandler)
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
    )
