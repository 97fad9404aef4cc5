"""Alembic environment of pgqueue.

The schema name and DSN come from ``config.attributes`` (set by
``pgqueue.migrate``); the version table lives in the pgqueue schema itself, so
two apps with two schemas in one database migrate independently.
"""

from __future__ import annotations

import psycopg
from alembic import context
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

config = context.config
schema: str = config.attributes["schema"]
dsn: str = config.attributes.get("dsn", "")
quoted_schema = sql.Identifier(schema).as_string()
create_schema = f"CREATE SCHEMA IF NOT EXISTS {quoted_schema};\n"


def run_offline() -> None:
    context.configure(
        url="postgresql://",
        dialect_name="postgresql",
        version_table_schema=schema,
        transactional_ddl=True,
        as_sql=True,
    )
    with context.begin_transaction():
        context.get_context().impl.static_output(create_schema)
        context.run_migrations()


def run_online() -> None:
    engine = create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(dsn),
        poolclass=NullPool,
    )
    with engine.connect() as connection:
        raw = connection.connection.driver_connection
        assert raw is not None
        # Serialise concurrent migrations of this schema; the lock ends with the
        # transaction, after the version row is written.
        raw.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"pgqueue.migrate.{schema}",))
        raw.execute(create_schema)
        context.configure(
            connection=connection,
            version_table_schema=schema,
            transactional_ddl=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
