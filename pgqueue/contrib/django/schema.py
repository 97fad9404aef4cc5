"""pgqueue's schema as part of ``manage.py migrate``.

The Django app ``pgqueue`` has one migration per revision of pgqueue's own
(Alembic) migrations. Each applies pgqueue's schema with pgqueue's own code
(:func:`pgqueue.migrate.upgrade`, what ``pgqueue migrate`` runs), to head, in
the Django database being migrated, for every schema that pgqueue uses there:
the project App's and each ``PgQueueBackend``'s. pgqueue's migrations are
idempotent, so a schema already at head (``manage.py pgqueue migrate`` ran
first) is left as it is and the Django migration is recorded. Reversed, the
first migration drops the schema with everything in it (what ``pgqueue
uninstall`` does; a schema at another revision than this pgqueue's is taken
down to none by pgqueue's own downgrade), a later one takes the schema back
to the revision before.

So Django's test runner, which migrates the test database it creates, puts
pgqueue's schema in it; ``manage.py sqlmigrate pgqueue 0001`` prints the SQL.
"""

from __future__ import annotations

import io
from typing import Any

from django.db import router
from django.db.migrations.operations.base import Operation

__all__ = ["ApplySchema", "migration_names", "schemas_on"]


def schemas_on(alias: str) -> list[str]:
    """The pgqueue schemas that the project uses on the Django database ``alias``."""
    from pgqueue.contrib.django import _databases, get_app
    from pgqueue.contrib.django.tasks import pgqueue_backends

    get_app()
    # A backend's jobs are written through Django's connection: its schema
    # belongs on its database, whichever App it reads through.
    backends = [b for b in pgqueue_backends() if b.database_alias == alias]
    found = {b.app.schema for b in backends}
    found.update(app.schema for app in _databases.following(alias))
    return sorted(found)


def migration_names() -> list[str]:
    """The names of this app's Django migrations, in order."""
    import pkgutil

    from pgqueue.contrib.django import migrations

    return sorted(m.name for m in pkgutil.iter_modules(migrations.__path__))


class ApplySchema(Operation):
    """Bring pgqueue's schemas on the database being migrated to head;
    reversed, to ``reverse_to`` (an Alembic revision; None: drop them)."""

    reversible = True
    reduces_to_sql = True  # forwards: `sqlmigrate` prints pgqueue's SQL
    elidable = False

    def __init__(self, reverse_to: str | None = None) -> None:
        self.reverse_to = reverse_to

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (f"{__name__}.ApplySchema", [], {"reverse_to": self.reverse_to})

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # no models

    def describe(self) -> str:
        return "Apply pgqueue's schema (what `pgqueue migrate` applies)"

    @property
    def migration_name_fragment(self) -> str:
        return "schema"

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        from pgqueue.migrate import upgrade

        for dsn, schema in self._targets(app_label, schema_editor):
            if schema_editor.collect_sql:  # sqlmigrate: the SQL of a new schema
                text = upgrade(dsn, schema, sql=True, output=io.StringIO())
                schema_editor.collected_sql.append(text or "")
            else:
                upgrade(dsn, schema)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        from pgqueue.app import App
        from pgqueue.migrate import current, downgrade
        from pgqueue.version import SCHEMA_REVISION

        for dsn, schema in self._targets(app_label, schema_editor):
            if schema_editor.collect_sql:
                schema_editor.collected_sql.append(
                    f"-- pgqueue: {self.describe_backwards(schema)}: "
                    "THIS OPERATION CANNOT BE WRITTEN AS SQL"
                )
                continue
            revision = current(dsn, schema)
            if revision is None:
                continue  # nothing of pgqueue's there: nothing to remove
            if self.reverse_to is None and revision == SCHEMA_REVISION:
                with App(dsn, schema, pool_min_size=0) as app:
                    app.uninstall()  # what `pgqueue uninstall` does: the schema goes
            else:
                downgrade(dsn, schema, self.reverse_to or "base")

    def describe_backwards(self, schema: str) -> str:
        if self.reverse_to is None:
            return f'drop schema "{schema}" with every job in it'
        return f'take schema "{schema}" back to revision {self.reverse_to}'

    def _targets(self, app_label: str, schema_editor: Any) -> list[tuple[str, str]]:
        from pgqueue.contrib.django._databases import connection_dsn

        connection = schema_editor.connection
        if connection.vendor != "postgresql" or not router.allow_migrate(
            connection.alias, app_label
        ):
            return []
        dsn = connection_dsn(connection)
        return [(dsn, schema) for schema in schemas_on(connection.alias)]
