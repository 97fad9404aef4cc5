"""``App.point_at``: an App moved in place to another database or schema
(what Django's integration does when Django moves to its test database)
keeps its tasks, middleware and settings, closes its old pools, and writes
where it points; bad input changes nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgqueue
from pgqueue.errors import ConnectionFailed, InvalidName
from pgqueue.models import JobSpec
from tests.fixtures.cluster import migrate


class Tagging(pgqueue.Middleware):
    def before_enqueue(self, spec: JobSpec) -> JobSpec:
        return spec._replace(tags=[*(spec.tags or ()), "svc:orders"])


def _jobs(dsn: str, schema: str = "pgqueue") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT task, tags, max_attempts FROM {}.jobs ORDER BY id")
        return conn.execute(query.format(sql.Identifier(schema))).fetchall()


def _sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'pgqueue' AND datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_point_at_moves_everything_but_the_app(db_dsn: str, empty_db_dsn: str) -> None:
    migrate(empty_db_dsn)
    migrate(empty_db_dsn, schema="pgqueue_other")
    app = pgqueue.App(db_dsn, middleware=[Tagging()])
    try:

        @app.task(max_attempts=7)
        def ship(order_id: int) -> None: ...

        ship.enqueue(order_id=1)
        assert _sessions(db_dsn) >= 1  # the pool holds its connections
        tasks, middleware = app.tasks, app.middleware

        app.point_at(empty_db_dsn)
        assert (app.dsn, app.schema) == (empty_db_dsn, "pgqueue")
        assert _sessions(db_dsn) == 0  # the old pools are closed
        ship.enqueue(order_id=2)
        assert app.get_job(1).payload == {"order_id": 2}
        assert _jobs(empty_db_dsn) == [("ship", ["svc:orders"], 7)]  # middleware, task defaults
        assert len(_jobs(db_dsn)) == 1
        assert app.tasks is tasks
        assert app.middleware is middleware

        app.point_at(schema="pgqueue_other")
        ship.enqueue(order_id=3)
        assert _jobs(empty_db_dsn, "pgqueue_other") == [("ship", ["svc:orders"], 7)]
        assert len(_jobs(empty_db_dsn)) == 1

        app.point_at(db_dsn, schema="pgqueue")
        assert app.get_job(1).payload == {"order_id": 1}
    finally:
        app.close()


def test_point_at_refuses_bad_input_and_changes_nothing(app: pgqueue.App, db_dsn: str) -> None:
    before = (app.dsn, app.schema, app._database, app.op_context)
    with pytest.raises(InvalidName, match="invalid schema name"):
        app.point_at(schema="Not-A-Schema")
    with pytest.raises(ConnectionFailed, match="invalid DSN"):
        app.point_at("not a dsn")
    assert (app.dsn, app.schema, app._database, app.op_context) == before
    app.enqueue("t", {})
    assert len(_jobs(db_dsn)) == 1
