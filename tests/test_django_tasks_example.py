"""examples/django_shop with Django's Tasks framework on pgqueue: an order's
confirmation is a ``django.tasks`` task (the backport on Django < 6) enqueued
in the order's transaction, run by ``manage.py pgqueue worker`` and read back
through the framework. CI runs this on Python 3.11 with the backport and on
Python 3.12 with Django 6."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import migrate
from tests.fixtures.cluster import drop_database
from tests.fixtures.workers import REPO_ROOT, Workers, subprocess_env, wait_until

pytest.importorskip("django")
if not any(importlib.util.find_spec(name) for name in ("django.tasks", "django_tasks")):
    pytest.skip("no django.tasks (Django 6) and no django-tasks", allow_module_level=True)

EXAMPLE = REPO_ROOT / "examples" / "django_shop"

_ORDERS = """
import json
from django.test import Client
c = Client()
for query in ("item=book", "item=pen&fail=1", "item=ink"):
    r = c.post("/orders?" + query)
    print(json.dumps([r.status_code, r.json()]))
"""

_CONFIRMATIONS = """
import json, sys
from django.test import Client
c = Client()
print(json.dumps([c.get("/confirmations/" + i).json() for i in sys.argv[1:]]))
"""


def _manage(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE / "manage.py"), *args],
        cwd=EXAMPLE,
        env=subprocess_env(dsn, {"DATABASE_URL": dsn}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _shell(dsn: str, code: str, *argv: str) -> list[Any]:
    script = f"import sys; sys.argv[1:] = {list(argv)!r}\n{code}"
    done = _manage(dsn, "shell", "-c", script)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]


def test_example_confirms_orders_with_django_tasks(db_dsn: str, workers: Workers) -> None:
    for command in (("migrate", "--no-input"), ("pgqueue", "migrate")):
        done = _manage(db_dsn, *command)
        assert done.returncode == 0, done.stderr

    placed = _shell(db_dsn, _ORDERS)
    assert [status for status, _ in placed] == [201, 402, 201]
    confirmations = [body["confirmation"] for status, body in placed if status == 201]
    with psycopg.connect(db_dsn) as conn:
        tasks = conn.execute("SELECT task, queue FROM pgqueue.jobs ORDER BY id").fetchall()
    # The declined order left neither its pgqueue job nor its Django task.
    assert sorted(tasks) == sorted(
        [("ship_order", "default"), ("shop.orders.tasks.send_confirmation", "emails")] * 2
    )
    [pending] = _shell(db_dsn, _CONFIRMATIONS, confirmations[0])
    assert pending == [{"status": "READY", "attempts": 0}]

    worker = workers.spawn(
        command=[sys.executable, str(EXAMPLE / "manage.py"), "pgqueue", "worker"],
        env={"DATABASE_URL": db_dsn},
    )

    def confirmed() -> list[Any] | None:
        [bodies] = _shell(db_dsn, _CONFIRMATIONS, *confirmations)
        return bodies if all(b["status"] == "SUCCESSFUL" for b in bodies) else None

    bodies = wait_until(confirmed, 60, "the confirmations", [worker])
    assert [b["value"] for b in bodies] == [
        f"order {placed[0][1]['order']} (book) confirmed",
        f"order {placed[2][1]['order']} (ink) confirmed",
    ]
    assert {b["attempts"] for b in bodies} == {1}


# --- a fresh project: the setup order of the README, and `manage.py test` ------------


def _schemas(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgqueue%' ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def test_migrate_applies_pgqueue_schema_in_readme_order(empty_db_dsn: str) -> None:
    # Before anything is migrated, no command is refused: a warning names the fix.
    checked = _manage(empty_db_dsn, "check")
    assert checked.returncode == 0, checked.stderr
    assert "TASKS['default']: (pgqueue.W002)" in checked.stderr
    assert "HINT: run `manage.py migrate`" in checked.stderr
    made = _manage(empty_db_dsn, "makemigrations", "--check", "--dry-run")
    assert made.returncode == 0, made.stderr
    # For a DBA: the SQL pgqueue's migration runs (`pgqueue migrate --sql`'s).
    shown = _manage(empty_db_dsn, "sqlmigrate", "pgqueue", "0001")
    assert shown.returncode == 0, shown.stderr
    assert 'CREATE SCHEMA IF NOT EXISTS "pgqueue";' in shown.stdout
    assert 'CREATE TABLE "pgqueue".jobs (' in shown.stdout
    assert _schemas(empty_db_dsn) == []

    migrated = _manage(empty_db_dsn, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying pgqueue.0001_schema... OK" in migrated.stdout
    assert _schemas(empty_db_dsn) == ["pgqueue"]
    checked = _manage(empty_db_dsn, "check")
    assert (checked.returncode, "pgqueue" in checked.stderr) == (0, False)
    again = _manage(empty_db_dsn, "pgqueue", "migrate")
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout

    # Hints of the CLI name it as invoked.
    listed = _manage(empty_db_dsn, "pgqueue", "schedule", "list")
    assert listed.returncode == 0, listed.stderr
    assert "add one with `manage.py pgqueue schedule add`" in listed.stderr

    # Reversed, pgqueue's migration uninstalls; applied again, it installs.
    zero = _manage(empty_db_dsn, "migrate", "pgqueue", "zero")
    assert zero.returncode == 0, zero.stderr
    assert "Unapplying pgqueue.0001_schema... OK" in zero.stdout
    assert _schemas(empty_db_dsn) == []
    migrated = _manage(empty_db_dsn, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    assert _schemas(empty_db_dsn) == ["pgqueue"]


def test_migrate_after_pgqueue_migrate_keeps_the_schema(db_dsn: str) -> None:
    """A project that ran `manage.py pgqueue migrate` first (the schema at
    head, with jobs): Django's migration records itself and changes nothing."""
    with pgqueue.App(db_dsn) as app:
        job = app.enqueue("ship_order", {"order_id": 1})
        before = migrate.current(db_dsn)
    migrated = _manage(db_dsn, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying pgqueue.0001_schema... OK" in migrated.stdout
    assert migrate.current(db_dsn) == before
    with pgqueue.App(db_dsn) as app:
        assert app.get_job(job.job_id).status == "queued"


def test_manage_py_test_runs_in_the_test_database(empty_db_dsn: str, pg_server_dsn: str) -> None:
    """The example's tests (shop/orders/tests.py) enqueue through views and
    the Tasks framework, drain, and read results back: all in Django's test
    database, which `migrate` gave pgqueue's schema."""
    test_db = f"test_{psycopg.conninfo.conninfo_to_dict(empty_db_dsn)['dbname']}"
    try:
        done = _manage(empty_db_dsn, "test", "--no-input", "-v", "2")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Applying pgqueue.0001_schema... OK" in done.stdout
        assert "Ran 2 tests" in done.stderr
        assert done.stderr.rstrip().splitlines()[-2:] == [
            "OK",
            f"Destroying test database for alias 'default' ('{test_db}')...",
        ]
        # The development database was never written to.
        assert _schemas(empty_db_dsn) == []
    finally:
        drop_database(pg_server_dsn, test_db)
