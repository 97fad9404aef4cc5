"""Django tasks run by worker processes: ``manage.py pgqueue worker`` (here
``python -m django pgqueue worker``) and the plain ``pgqueue worker`` pointed
at the Django settings; operators see them with ``status`` and ``jobs show``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.django_tasks_support import finished, tasks
from tests.fixtures.workers import REPO_ROOT, Workers, pgqueue_command, subprocess_env

__all__ = ["tasks"]  # the fixture

SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.apps.django_settings"}


def _django(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=REPO_ROOT,
        env=subprocess_env(dsn, {"DATABASE_URL": dsn, **SETTINGS}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_manage_py_worker_and_plain_worker(
    tasks: ModuleType, db_dsn: str, workers: Workers
) -> None:
    summed = tasks.add.enqueue(1, 2)
    sent = tasks.send.enqueue("ops@example.com", subject="report")
    failed = tasks.explode.enqueue("from a worker process")
    env = {"DATABASE_URL": db_dsn, **SETTINGS}
    # manage.py pgqueue worker serves "default"; the plain pgqueue worker "emails".
    by_django = workers.spawn(
        command=[
            sys.executable,
            "-m",
            "django",
            "pgqueue",
            "worker",
            "--queue",
            "default",
            "--log-format",
            "json",
        ],
        env=env,
    )
    plain = workers.spawn(
        command=[
            *pgqueue_command(),
            "worker",
            "--app",
            "pgqueue.contrib.django:app",
            "--queue",
            "emails",
            "--log-format",
            "json",
        ],
        env=env,
    )
    for result in (summed, sent, failed):
        finished(result, timeout=60)
    assert summed.return_value == 3
    assert sent.return_value == {"to": "ops@example.com", "subject": "report"}
    assert failed.errors[0].exception_class_path == "tests.apps.django_tasks.Boom"
    registrations = {w.wait_registered()["id"]: w for w in (by_django, plain)}
    assert set(summed.worker_ids) | set(failed.worker_ids) == {
        i for i, w in registrations.items() if w is by_django
    }
    assert set(sent.worker_ids) == {i for i, w in registrations.items() if w is plain}

    status = _django(db_dsn, "pgqueue", "status", "--json")
    assert status.returncode == 0, status.stderr
    queues = {q["queue"]: q for q in json.loads(status.stdout)}
    assert (queues["default"]["succeeded"], queues["default"]["dead"]) == (1, 1)
    assert queues["emails"]["succeeded"] == 1

    shown = _django(db_dsn, "pgqueue", "jobs", "show", sent.id, "--json")
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert job["task"] == "tests.apps.django_tasks.send"
    assert job["payload"]["args"] == ["ops@example.com"]
    assert job["payload"]["kwargs"] == {"subject": "report"}
    assert job["result"] == {"to": "ops@example.com", "subject": "report"}

    listed = _django(db_dsn, "pgqueue", "jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "tests.apps.django_tasks.explode" in listed.stdout

    # Hints name the command as it was invoked (here through `python -m django`).
    explained = _django(db_dsn, "pgqueue", "jobs", "explain", failed.id)
    assert explained.returncode == 0, explained.stderr
    assert f"requeue it with `python -m django pgqueue dlq requeue {failed.id}`" in (
        explained.stdout
    )


def test_check_command_warns_of_an_unmigrated_schema(db_dsn: str, tmp_path: Path) -> None:
    ok = _django(db_dsn, "check")
    assert ok.returncode == 0, ok.stderr
    assert "pgqueue" not in ok.stderr
    (tmp_path / "unmigrated_settings.py").write_text(
        "from tests.apps.django_settings import *\n"
        "TASKS = {'default': {**TASKS['default'], 'OPTIONS': {'schema': 'elsewhere'}}}\n"
    )
    other = ("--settings", "unmigrated_settings", "--pythonpath", str(tmp_path))

    warned = _django(db_dsn, "check", *other)
    # A warning: `manage.py migrate`, which applies the schema, must run.
    assert warned.returncode == 0, warned.stderr
    assert (
        "TASKS['default']: (pgqueue.W002) schema \"elsewhere\" is not migrated\n"
        "\tHINT: run `manage.py migrate`"
    ) in warned.stderr
    assert "object at 0x" not in warned.stderr
    assert _django(db_dsn, "check", "--fail-level", "WARNING", *other).returncode != 0

    migrated = _django(db_dsn, "migrate", *other)
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying pgqueue.0001_schema... OK" in migrated.stdout
    clean = _django(db_dsn, "check", *other)
    assert (clean.returncode, clean.stderr) == (0, "")

    # Dropped behind Django's back: `migrate` would do nothing (its migration is
    # recorded), so the hint names the command that recreates it.
    dropped = _django(db_dsn, "pgqueue", "uninstall", "--yes", *other)
    assert dropped.returncode == 0, dropped.stderr
    warned = _django(db_dsn, "check", *other)
    assert "HINT: run `manage.py pgqueue migrate`" in warned.stderr
