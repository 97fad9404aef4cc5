"""pgqueue in a Django project.

Add ``"pgqueue.contrib.django"`` to ``INSTALLED_APPS``. Then:

- ``manage.py migrate`` applies pgqueue's schema (the ``pgqueue`` app's
  migrations, see :mod:`pgqueue.contrib.django.schema`), in Django's test
  database too.
- ``manage.py pgqueue <command> ...`` runs any ``pgqueue`` command (``migrate``,
  ``worker``, ``status``, ``jobs``, ``dashboard`` ...) against the database of
  Django's ``DATABASES`` (the ``PGQUEUE_DATABASE`` alias, default ``"default"``);
  ``worker`` serves the project's App unless ``--app`` is given.
- The Apps on a Django database follow it wherever Django points it, its
  test databases included (see :mod:`pgqueue.contrib.django._databases`).
- Each installed app's ``tasks.py`` is imported at start-up, so tasks declared
  there with ``@app.task`` are registered wherever Django runs.
- ``pgqueue.contrib.django.app`` is the project's App: the one named by the
  ``PGQUEUE_APP`` setting (``"pkg.module:app"``), else one built from
  ``DATABASES`` and ``PGQUEUE_SCHEMA`` (default: the ``schema`` OPTION of a
  ``PgQueueBackend`` in ``TASKS``, else ``"pgqueue"``). Read outside a
  started Django (``pgqueue worker --app pgqueue.contrib.django:app`` with
  ``DJANGO_SETTINGS_MODULE`` set), it runs ``django.setup()`` first.
- ``pgqueue.contrib.django.tasks.PgQueueBackend`` is a backend for Django's
  Tasks framework (``django.tasks``): its tasks run in the same workers.

Enqueue in the request's transaction with ``conn=django.db.connection``::

    from django.db import connection, transaction
    from pgqueue.contrib.django import app

    with transaction.atomic():
        order = Order.objects.create(...)
        app.enqueue("ship_order", {"order_id": order.pk}, conn=connection)
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.app import App

    app: App  # resolved on first access by __getattr__ below

__all__ = ["app", "app_path", "database_alias", "database_dsn", "forget_app", "get_app"]

_lock = threading.Lock()
_app: App | None = None

#: The ``--app`` value of ``manage.py pgqueue worker`` without PGQUEUE_APP.
DEFAULT_APP_PATH = "pgqueue.contrib.django:app"


def database_dsn(alias: str | None = None) -> str:
    """A libpq DSN for the Django database ``alias`` (default: the
    ``PGQUEUE_DATABASE`` setting, else ``"default"``), with the same
    connection parameters Django itself passes to psycopg (under Django's
    test runner: its test database)."""
    from django.db import connections

    from pgqueue.contrib.django._databases import connection_dsn
    from pgqueue.errors import InvalidOption

    alias = alias or database_alias()
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        raise InvalidOption(
            f"DATABASES[{alias!r}] uses {wrapper.vendor!r}: pgqueue needs PostgreSQL"
        )
    return connection_dsn(wrapper)


def database_alias() -> str:
    """The Django database of the project's App: ``PGQUEUE_DATABASE``, else ``"default"``."""
    from django.conf import settings

    return str(getattr(settings, "PGQUEUE_DATABASE", None) or "default")


def app_path() -> str:
    """What ``manage.py pgqueue worker`` serves: ``PGQUEUE_APP`` or the default App."""
    from django.conf import settings

    return str(getattr(settings, "PGQUEUE_APP", None) or DEFAULT_APP_PATH)


def get_app() -> App:
    """The project's App (see the module docstring); one per process."""
    global _app
    if _app is None:
        with _lock:
            if _app is None:
                _app = _load()
    return _app


def forget_app() -> App | None:
    """Drop the cached project App (built again on next use, e.g. after
    ``override_settings``); returns it, None when there was none."""
    global _app
    from pgqueue.contrib.django import _databases

    with _lock:
        app, _app = _app, None
    if app is not None:
        _databases.forget(app)
    return app


def _load() -> App:
    """The project's App, following its Django database (see ``_databases``)
    when it is on one: always when pgqueue builds it, and a ``PGQUEUE_APP``
    when its DSN names the same database."""
    from django.conf import settings

    from pgqueue.app import App
    from pgqueue.contrib.django import _databases
    from pgqueue.errors import InvalidOption

    path = getattr(settings, "PGQUEUE_APP", None)
    if not path:
        schema = getattr(settings, "PGQUEUE_SCHEMA", None) or _tasks_schema() or "pgqueue"
        django_dsn = database_dsn()
        app = App(dsn=django_dsn, schema=schema)
        _databases.follow(app, database_alias(), django_dsn)
        return app
    module_name, _, attribute = str(path).partition(":")
    obj = getattr(importlib.import_module(module_name), attribute or "app", None)
    if not isinstance(obj, App):
        raise InvalidOption(f"PGQUEUE_APP {path!r} does not name a pgqueue.App")
    try:
        django_dsn = database_dsn()
    except InvalidOption:  # Django's own database is not PostgreSQL: nothing to follow
        return obj
    if _databases.same_database(obj.dsn, django_dsn):
        _databases.follow(obj, database_alias(), django_dsn)
    return obj


def _tasks_schema() -> str | None:
    """The ``schema`` OPTION of the first pgqueue backend in ``TASKS``."""
    from django.conf import settings

    for params in (getattr(settings, "TASKS", None) or {}).values():
        if str(params.get("BACKEND", "")).startswith(f"{__name__}.tasks."):
            schema = (params.get("OPTIONS") or {}).get("schema")
            if schema:
                return str(schema)
    return None


def _setup_django() -> None:
    """``django.setup()`` when this runs outside a started Django (the plain
    ``pgqueue`` command); nothing inside one (or while apps are loading)."""
    from django.apps import apps

    if not apps.ready and not apps.loading:
        import django

        django.setup()
        from pgqueue.contrib.django.tasks import prepare_backends

        prepare_backends()  # again: no-op when INSTALLED_APPS has this app


def __getattr__(name: str) -> Any:
    if name == "app":
        _setup_django()
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
