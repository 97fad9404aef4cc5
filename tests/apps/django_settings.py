"""A Django project whose tasks run on pgqueue (tests/test_django_tasks*.py):
``DJANGO_SETTINGS_MODULE=tests.apps.django_settings`` with ``DATABASE_URL``."""

from __future__ import annotations

import os
from typing import Any

from psycopg.conninfo import conninfo_to_dict

BACKEND = "pgqueue.contrib.django.tasks.PgQueueBackend"
TASKS: dict[str, Any] = {
    "default": {
        "BACKEND": BACKEND,
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"schema": "pgqueue"},
    },
    "retrying": {
        "BACKEND": BACKEND,
        "QUEUES": ["default"],
        "OPTIONS": {"schema": "pgqueue", "max_attempts": 3},
    },
}


def database(dsn: str) -> dict[str, Any]:
    """Django's DATABASES entry for a libpq DSN."""
    info = conninfo_to_dict(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info.get("dbname", ""),
        "USER": info.get("user", ""),
        "PASSWORD": info.get("password", ""),
        "HOST": info.get("host", ""),
        "PORT": info.get("port", ""),
    }


SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["pgqueue.contrib.django"]
DATABASES = {"default": database(os.environ.get("DATABASE_URL", ""))}
