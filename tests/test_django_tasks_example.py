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
