"""Django: conn=django.db.connection shares Django's transaction (commit,
rollback, savepoints, autocommit), and pgqueue.contrib.django runs the CLI
and a worker with Django's settings (the example project under examples/)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.errors import InvalidOption
from tests.fixtures.dbstate import row_counts
from tests.fixtures.workers import REPO_ROOT, Workers, subprocess_env, wait_until

django = pytest.importorskip("django")

EXAMPLE = REPO_ROOT / "examples" / "django_shop"


def _settings_dict(dsn: str) -> dict[str, Any]:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info.get("dbname", ""),
        "USER": info.get("user", ""),
        "PASSWORD": info.get("password", ""),
        "HOST": info.get("host", ""),
        "PORT": info.get("port", ""),
    }


@pytest.fixture
def django_db(db_dsn: str) -> Iterator[Any]:
    """Django configured in this process, its default database the test's."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["pgqueue.contrib.django"],
            DATABASES={"default": _settings_dict(db_dsn)},
            USE_TZ=True,
        )
        django.setup()
    from django.db import connection, connections

    connections.close_all()
    connections.settings["default"].update(_settings_dict(db_dsn))
    try:
        yield connection
    finally:
        connections.close_all()


def _payloads(dsn: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT payload FROM pgqueue.jobs ORDER BY id")]


def test_commit_rollback_and_savepoints(app: pgqueue.App, db_dsn: str, django_db: Any) -> None:
    from django.db import transaction

    with transaction.atomic():
        app.enqueue("t", {"n": 1}, conn=django_db)
        assert row_counts(db_dsn)["jobs"] == 0  # not before commit
    assert _payloads(db_dsn) == [{"n": 1}]

    try:
        with transaction.atomic():
            app.enqueue("t", {"n": 2}, conn=django_db)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert _payloads(db_dsn) == [{"n": 1}]

    with transaction.atomic():
        app.enqueue("t", {"n": 3}, conn=django_db)
        try:
            with transaction.atomic():  # a savepoint
                app.enqueue("t", {"n": 4}, conn=django_db)
                raise RuntimeError("savepoint rolled back")
        except RuntimeError:
            pass
        task = app.task(name="t")(lambda **_: None)
        task.with_options(conn=django_db).enqueue(n=5)
    assert _payloads(db_dsn) == [{"n": 1}, {"n": 3}, {"n": 5}]

    # Outside atomic() Django autocommits: so does the job.
    app.enqueue("t", {"n": 6}, conn=django_db)
    assert _payloads(db_dsn)[-1] == {"n": 6}


def test_async_twin_refuses_django(app: pgqueue.App, django_db: Any) -> None:
    async def run() -> None:
        with pytest.raises(InvalidOption, match="sync_to_async"):
            await app.enqueue_async("t", {}, conn=django_db)

    asyncio.run(run())


def test_default_app_uses_django_database(db_dsn: str, django_db: Any) -> None:
    import pgqueue.contrib.django as contrib

    dsn = contrib.database_dsn()
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    assert row[0] == psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]
    assert contrib.app_path() == "pgqueue.contrib.django:app"


# --- the example project, through manage.py ------------------------------------


def _manage(dsn: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE / "manage.py"), *args],
        cwd=EXAMPLE,
        env=subprocess_env(dsn, {"DATABASE_URL": dsn}),
        input=input or "",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


_PLACE_ORDERS = """
from django.test import Client
c = Client()
print(c.post("/orders?item=book").status_code)
print(c.post("/orders?item=pen&fail=1").status_code)
print(c.post("/orders?item=ink").status_code)
"""


def test_example_project(db_dsn: str, workers: Workers) -> None:
    done = _manage(db_dsn, "migrate", "--no-input")
    assert done.returncode == 0, done.stderr
    done = _manage(db_dsn, "pgqueue", "migrate")
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout

    done = _manage(db_dsn, "shell", "-c", _PLACE_ORDERS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-3:] == ["201", "402", "201"]
    with psycopg.connect(db_dsn) as conn:
        orders = conn.execute("SELECT item, job_id FROM orders_order ORDER BY id").fetchall()
    # The failed request left neither its order nor its job.
    assert [o[0] for o in orders] == ["book", "ink"]
    # Each order: ship_order (pgqueue) and send_confirmation (django.tasks).
    assert row_counts(db_dsn)["jobs"] == 4

    worker = workers.spawn(
        command=[
            sys.executable,
            str(EXAMPLE / "manage.py"),
            "pgqueue",
            "worker",
            "--concurrency",
            "2",
            "--log-format",
            "json",
        ],
        env={"DATABASE_URL": db_dsn},
    )

    def shipped() -> bool | None:
        with psycopg.connect(db_dsn) as conn:
            rows = conn.execute("SELECT shipped FROM orders_order").fetchall()
        return all(r[0] for r in rows) or None

    wait_until(shipped, 60, "the orders to be shipped", [worker])
    statuses = workers.wait_statuses([o[1] for o in orders])
    assert set(statuses.values()) == {"succeeded"}

    status = _manage(db_dsn, "pgqueue", "status", "--json")
    assert status.returncode == 0, status.stderr
    by_queue = {q["queue"]: q for q in json.loads(status.stdout)}
    assert by_queue["default"]["succeeded"] == 2

    bad = _manage(db_dsn, "pgqueue", "jobs", "show", "999999")
    assert bad.returncode == 1
    assert "999999" in bad.stderr


def test_manage_help_lists_pgqueue_commands(db_dsn: str) -> None:
    done = _manage(db_dsn, "pgqueue", "--help")
    assert done.returncode == 0, done.stderr
    assert "worker" in done.stdout
    assert "migrate" in done.stdout


def test_a_django_migration_per_pgqueue_revision() -> None:
    """`manage.py migrate` keeps a project's schema at head across pgqueue
    upgrades only if each of pgqueue's revisions has its Django migration:
    ``NNNN_*`` applies up to head, and reversed takes the schema back to the
    revision before (the first: uninstalls)."""
    import importlib

    from alembic.script import ScriptDirectory

    from pgqueue.contrib.django.schema import ApplySchema, migration_names

    script = ScriptDirectory(str(REPO_ROOT / "migrations"))
    revisions = list(reversed(list(script.walk_revisions())))
    names = migration_names()
    assert [name.partition("_")[0] for name in names] == [r.revision for r in revisions]
    for name, revision in zip(names, revisions, strict=True):
        module = importlib.import_module(f"pgqueue.contrib.django.migrations.{name}")
        [operation] = module.Migration.operations
        assert isinstance(operation, ApplySchema)
        assert operation.reverse_to == revision.down_revision
        assert module.Migration.atomic is False  # pgqueue's own transaction
