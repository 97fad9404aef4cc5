"""A Router over two schemas of the test's database, each App with the tasks
of :mod:`tests.apps.tasks`: ``pgqueue worker --app tests.apps.routed:router``
serves both in one process."""

from __future__ import annotations

import os

import pgqueue
from tests.apps.tasks import TASKS

SCHEMAS = ("pgqueue", "pgqueue_second")


def build_router(dsn: str | None = None) -> pgqueue.Router:
    apps = {}
    for schema in SCHEMAS:
        app = pgqueue.App(dsn, schema=schema)
        for func, options in TASKS.items():
            app.task(**options)(func)
        apps[schema] = app
    return pgqueue.Router(apps)


router = build_router(os.environ.get("PGQUEUE_DSN"))
