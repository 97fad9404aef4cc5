"""pgqueue's Apps on Django's databases, wherever Django points them.

An App on a Django database (the project's App, a ``PgQueueBackend``'s, or
the ``PGQUEUE_APP`` one when it names the same database) *follows* it: when
Django opens a connection of that alias with other parameters than before
(its test runner sets ``NAME`` to ``test_<name>``; a parallel test worker to
``test_<name>_<n>``), the App is pointed there (:meth:`pgqueue.App.point_at`),
so jobs, results and workers live where Django's own tables do; when Django
comes back to the first parameters, so does the App, with its own DSN.

Before Django creates, clones or drops a database (on a connection of its
``NO_DB_ALIAS``), the following Apps close their pools: PostgreSQL refuses to
drop a database, or to copy one, while other sessions are connected to it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgqueue.app import App

__all__ = ["connection_dsn", "follow", "following", "forget", "same_database"]


@dataclass
class _Alias:
    """The Apps on one Django database alias."""

    first_dsn: str  # the alias's DSN when the first App joined
    dsn: str  # its DSN the last time Django connected
    apps: dict[int, tuple[App, str]] = field(default_factory=dict)  # id -> (app, its own DSN)


_lock = threading.Lock()
_aliases: dict[str, _Alias] = {}


@cache
def _libpq_keywords() -> frozenset[str]:
    import psycopg

    return frozenset(d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults())


def connection_dsn(wrapper: Any) -> str:
    """A libpq DSN for a Django database connection (``connections[alias]``),
    with the parameters Django itself passes to the driver."""
    import psycopg

    keywords = _libpq_keywords()
    params = {
        key: value
        for key, value in wrapper.get_connection_params().items()
        if key in keywords and isinstance(value, str | int) and value != ""
    }
    return psycopg.conninfo.make_conninfo("", **params)


def _target(dsn: str) -> tuple[str, str, str, str]:
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return (
        str(info.get("host") or info.get("hostaddr") or ""),
        str(info.get("port") or "5432"),
        str(info.get("dbname") or ""),
        str(info.get("user") or ""),
    )


def same_database(a: str, b: str) -> bool:
    """Whether two DSNs name the same database (host, port, name, user)."""
    try:
        return _target(a) == _target(b)
    except Exception:  # an unparsable DSN names no database we know
        return False


def follow(app: App, alias: str, django_dsn: str) -> None:
    """Let ``app`` follow the Django database ``alias`` (whose DSN is now
    ``django_dsn``) from now on."""
    _connect_signal()
    with _lock:
        state = _aliases.setdefault(alias, _Alias(first_dsn=django_dsn, dsn=django_dsn))
        state.apps[id(app)] = (app, app.dsn)


def following(alias: str) -> list[App]:
    """The Apps that follow the Django database ``alias``."""
    with _lock:
        state = _aliases.get(alias)
        return [] if state is None else [app for app, _ in state.apps.values()]


def forget(app: App | None = None) -> None:
    """Stop following for ``app`` (None: for every App)."""
    with _lock:
        if app is None:
            _aliases.clear()
            return
        for state in _aliases.values():
            state.apps.pop(id(app), None)


def _connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    from django.db.backends.base.base import NO_DB_ALIAS

    if connection.vendor != "postgresql":
        return
    if connection.alias == NO_DB_ALIAS:
        _release()
        return
    with _lock:
        state = _aliases.get(connection.alias)
        if state is None:
            return
        dsn = connection_dsn(connection)
        if dsn == state.dsn:
            return
        state.dsn = dsn
        moves = [(app, own if dsn == state.first_dsn else dsn) for app, own in state.apps.values()]
    for app, target in moves:
        if app.dsn != target:
            app.point_at(target)


def _release() -> None:
    """Close the pools of every following App (they reopen on next use)."""
    with _lock:
        apps = {id(app): app for state in _aliases.values() for app, _ in state.apps.values()}
    for app in apps.values():
        app.close()


def _connect_signal() -> None:
    from django.db.backends.signals import connection_created

    connection_created.connect(
        _connection_created, dispatch_uid="pgqueue.contrib.django.follow_databases"
    )
