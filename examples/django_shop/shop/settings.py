"""Settings of the example shop: one PostgreSQL database from DATABASE_URL."""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("DATABASE_URL", "postgresql:///shop"))

SECRET_KEY = "example-only"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "pgqueue.contrib.django",  # manage.py pgqueue ..., tasks.py discovery
    "shop.orders",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}

# Django's own Tasks framework (django.tasks; the django-tasks backport before
# Django 6) stores its tasks as pgqueue jobs, run by `manage.py pgqueue worker`.
TASKS = {
    "default": {
        "BACKEND": "pgqueue.contrib.django.tasks.PgQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"schema": "pgqueue"},
    }
}

# pgqueue's App is built from DATABASES["default"]; to use your own instead:
# PGQUEUE_APP = "shop.queue:app"
