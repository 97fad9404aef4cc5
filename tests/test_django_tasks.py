"""Django's Tasks framework on pgqueue (``PgQueueBackend``), in this process:
enqueue through the framework (in and out of transactions, deferred,
prioritised, failing), run a pgqueue worker, read results through the
framework; signals and ``takes_context``; the system check."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import ModuleType
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.apps.django_settings import TASKS
from tests.django_tasks_support import backend, finished, fw, tasks
from tests.fixtures.dbstate import row_counts
from tests.fixtures.workers import wait_until

__all__ = ["tasks"]  # the fixture


@contextmanager
def worker(**options: Any) -> Iterator[pgqueue.App]:
    """A pgqueue worker of the backends' App, in a thread of this process."""
    app = backend().app
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    options = {"concurrency": 2, "scheduler": False, "poll_interval": 0.2, **options}

    async def main() -> None:
        try:
            await app.run_worker_async(stop=stop, install_signal_handlers=False, **options)
        finally:
            await app.close_async()  # its async pool belongs to this loop

    def run() -> None:
        loop.run_until_complete(main())

    thread = threading.Thread(target=run, name="django-tasks-worker")
    thread.start()
    try:
        yield app
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def jobs(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT id, task, queue, priority, payload, run_at FROM pgqueue.jobs ORDER BY id"
        ).fetchall()


# --- the backend as the framework sees it -------------------------------------------


def test_features_and_queues(tasks: ModuleType) -> None:
    b = backend()
    assert type(b).__name__ == "PgQueueBackend"
    assert (b.supports_defer, b.supports_async_task, b.supports_get_result) == (True,) * 3
    assert b.supports_priority is True
    with pytest.raises(fw.InvalidTask, match="Queue 'nowhere' is not valid"):
        tasks.add.using(queue_name="nowhere")
    with pytest.raises(fw.InvalidTask, match="priority"):
        tasks.add.using(priority=101)


def test_enqueue_stores_a_readable_job(tasks: ModuleType, db_dsn: str) -> None:
    result = tasks.send.enqueue("a@b.c", subject="hello")
    assert result.status == fw.TaskResultStatus.READY
    assert result.args == ["a@b.c"]
    assert result.kwargs == {"subject": "hello"}
    assert result.backend == "default"
    assert result.enqueued_at is not None
    [(job_id, task, queue, priority, payload, _)] = jobs(db_dsn)
    assert result.id == str(job_id)
    assert (task, queue, priority) == ("tests.apps.django_tasks.send", "emails", 50)
    assert payload == {
        "task_path": "tests.apps.django_tasks.send",
        "args": ["a@b.c"],
        "kwargs": {"subject": "hello"},
        "backend": "default",
        "run_after": None,
    }
    stored = tasks.send.get_result(result.id)
    assert stored.status == fw.TaskResultStatus.READY
    assert (stored.args, stored.kwargs) == (["a@b.c"], {"subject": "hello"})
    assert stored.task.queue_name == "emails"
    assert stored.task.priority == 50
    assert (stored.worker_ids, stored.errors, stored.started_at) == ([], [], None)
    with pytest.raises(ValueError, match="not finished"):
        stored.return_value  # noqa: B018


def test_arguments_json_cannot_hold_are_refused(tasks: ModuleType, db_dsn: str) -> None:
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert row_counts(db_dsn)["jobs"] == 0


def test_enqueue_joins_the_django_transaction(tasks: ModuleType, db_dsn: str) -> None:
    from django.db import transaction

    try:
        with transaction.atomic():
            tasks.add.enqueue(1, 2)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert row_counts(db_dsn)["jobs"] == 0

    with transaction.atomic():
        kept = tasks.add.enqueue(3, 4)
        assert row_counts(db_dsn)["jobs"] == 0  # not before commit
        try:
            with transaction.atomic():  # a savepoint
                tasks.add.enqueue(5, 6)
                raise RuntimeError("savepoint rolled back")
        except RuntimeError:
            pass
    assert [j[0] for j in jobs(db_dsn)] == [int(kept.id)]


def test_workers_are_woken_at_commit(tasks: ModuleType, db_dsn: str) -> None:
    from django.db import transaction

    # Polling every 30 s: only the NOTIFY sent at commit can start the job soon.
    with worker(poll_interval=30):
        time.sleep(0.5)  # the worker is listening
        with transaction.atomic():
            result = tasks.add.enqueue(20, 22)
            time.sleep(0.3)
        finished(result, timeout=20)  # well before the 30 s poll: the commit's NOTIFY
    assert result.return_value == 42


def test_results_through_the_framework(tasks: ModuleType, db_dsn: str) -> None:
    summed = tasks.add.enqueue(2, 3)
    sent = tasks.send.enqueue("a@b.c")
    failed = tasks.explode.enqueue("bad input")
    doubled = tasks.double.enqueue(21)
    context = tasks.attempt_info.enqueue(tag="t")
    unstored = tasks.unstorable.enqueue()
    with worker() as app:
        for result in (summed, sent, failed, doubled, context, unstored):
            finished(result)
        worker_ids = {w.id for w in app.list_workers()}

    ok = tasks.add.get_result(summed.id)
    assert ok.status == fw.TaskResultStatus.SUCCESSFUL
    assert ok.return_value == 5
    assert ok.attempts == 1
    assert ok.errors == []
    assert set(ok.worker_ids) <= worker_ids
    assert ok.enqueued_at <= ok.started_at <= ok.finished_at
    assert ok.last_attempted_at == ok.started_at
    assert sent.return_value == {"to": "a@b.c", "subject": "hi"}
    assert doubled.return_value == 42

    assert failed.status == fw.TaskResultStatus.FAILED
    [error] = failed.errors
    assert error.exception_class_path == "tests.apps.django_tasks.Boom"
    assert error.exception_class is tasks.Boom
    assert "Traceback (most recent call last)" in error.traceback
    assert error.traceback.rstrip().endswith("tests.apps.django_tasks.Boom: bad input")
    with pytest.raises(ValueError, match="failed"):
        failed.return_value  # noqa: B018
    assert failed.finished_at is not None
    assert failed.attempts == 1

    # takes_context: the framework's context, with this attempt's result.
    info = context.return_value
    assert info["tag"] == "t"
    assert info["attempt"] == 1
    assert info["id"] == context.id
    assert info["status"] == str(fw.TaskResultStatus.RUNNING)
    assert info["worker_ids"] == context.worker_ids

    # A value JSON cannot hold fails the task, as with Django's own backends.
    assert unstored.status == fw.TaskResultStatus.FAILED
    assert unstored.errors[0].exception_class_path == "builtins.TypeError"


def test_result_lookup(tasks: ModuleType, app: pgqueue.App) -> None:
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(fw.TaskResultMismatch):
        tasks.explode.get_result(result.id)
    plain = app.enqueue("not_a_django_task", {"x": 1}).job_id
    for missing in ("nope", "999999", str(plain), "-1"):
        with pytest.raises(fw.TaskResultDoesNotExist):
            backend().get_result(missing)
    assert backend().get_result(result.id).id == result.id


def test_async_enqueue_and_results(tasks: ModuleType) -> None:
    async def enqueue() -> Any:
        return await tasks.double.aenqueue(5)

    result = asyncio.run(enqueue())
    with worker():
        finished(result)

    async def read() -> Any:
        try:
            fetched = await tasks.double.aget_result(result.id)
            await fetched.arefresh()
            with pytest.raises(fw.TaskResultDoesNotExist):
                await backend().aget_result("123456789")
            return fetched
        finally:
            await backend().app.close_async()  # its async pool belongs to this loop

    fetched = asyncio.run(read())
    assert fetched.status == fw.TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 10


def test_deferred_and_prioritised(tasks: ModuleType, db_dsn: str) -> None:
    from django.utils import timezone

    later = timezone.now() + timedelta(hours=1)
    deferred = tasks.add.using(run_after=later).enqueue(1, 2)
    low = tasks.attempt_info.using(priority=-100).enqueue(tag="low")
    high = tasks.attempt_info.using(priority=100).enqueue(tag="high")
    stored = {row[0]: row for row in jobs(db_dsn)}
    assert stored[int(deferred.id)][5] == later
    assert stored[int(deferred.id)][4]["run_after"] == later.isoformat()
    assert (stored[int(low.id)][3], stored[int(high.id)][3]) == (-100, 100)

    with worker(concurrency=1):
        finished(low)
        time.sleep(0.3)
    assert tasks.attempt_info.get_result(high.id).started_at < (
        tasks.attempt_info.get_result(low.id).started_at
    )
    waiting = tasks.add.get_result(deferred.id)
    assert waiting.status == fw.TaskResultStatus.READY
    assert waiting.task.run_after == later
    assert waiting.started_at is None


def test_retries_when_options_allow(tasks: ModuleType) -> None:
    result = tasks.flaky.enqueue()
    assert backend("retrying").max_attempts == 3
    with worker():
        finished(result, timeout=60)
    assert result.status == fw.TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2
    assert result.attempts == 2
    assert len(set(result.worker_ids)) == 1
    [error] = result.errors
    assert error.exception_class_path == "builtins.RuntimeError"
    assert "attempt 1 fails" in error.traceback
    assert result.started_at < result.last_attempted_at


def test_signals_fire_where_django_fires_them(tasks: ModuleType) -> None:
    seen: list[tuple[str, str, str, Any]] = []

    def receiver(name: str) -> Callable[..., None]:
        def record(sender: type[Any], task_result: Any, **kwargs: Any) -> None:
            assert sender is type(backend())
            seen.append((name, task_result.id, str(task_result.status), task_result.errors))

        return record

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    for name, func in receivers.items():
        getattr(fw.signals, f"task_{name}").connect(func)
    try:
        ok = tasks.add.enqueue(1, 2)
        assert seen == [("enqueued", ok.id, str(fw.TaskResultStatus.READY), [])]
        bad = tasks.explode.enqueue("no")
        doubled = tasks.double.enqueue(2)
        with worker():
            for result in (ok, bad, doubled):
                finished(result)
            wait_until(lambda: len(seen) == 9, 10, "every signal")
    finally:
        for name, func in receivers.items():
            getattr(fw.signals, f"task_{name}").disconnect(func)

    by_task: dict[str, list[tuple[str, str]]] = {}
    for name, result_id, status, _ in seen:
        by_task.setdefault(result_id, []).append((name, status))
    s = fw.TaskResultStatus
    assert by_task[ok.id] == [
        ("enqueued", str(s.READY)),
        ("started", str(s.RUNNING)),
        ("finished", str(s.SUCCESSFUL)),
    ]
    assert by_task[bad.id][1:] == [("started", str(s.RUNNING)), ("finished", str(s.FAILED))]
    assert by_task[doubled.id][1:] == [("started", str(s.RUNNING)), ("finished", str(s.SUCCESSFUL))]
    [failed_errors] = [e for name, i, _, e in seen if name == "finished" and i == bad.id]
    assert failed_errors[0].exception_class_path == "tests.apps.django_tasks.Boom"


def test_system_check_warns_of_an_unmigrated_schema(tasks: ModuleType) -> None:
    from django.core import checks
    from django.test import override_settings

    assert [m for m in checks.run_checks() if m.id and m.id.startswith("pgqueue")] == []
    elsewhere = {
        "default": {
            "BACKEND": TASKS["default"]["BACKEND"],
            "OPTIONS": {"schema": "not_migrated"},
        }
    }
    with override_settings(TASKS=elsewhere):
        fw.import_checks()
        messages = [m for m in checks.run_checks() if m.id == "pgqueue.W002"]
        assert len(messages) == 1
        [message] = messages
        assert message.msg == 'schema "not_migrated" is not migrated'
        # Django's migrations of pgqueue were never applied here: migrate applies the schema.
        assert message.hint == "run `manage.py migrate`"
        # A warning: it must not stop `manage.py migrate` (nor makemigrations, runserver).
        assert not message.is_serious()
        # The object is named as in settings, not <...PgQueueBackend object at 0x...>.
        assert str(message).startswith("TASKS['default']: (pgqueue.W002) schema")
        assert repr(message.obj) == "<PgQueueBackend 'default'>"


def test_unknown_options_are_refused(tasks: ModuleType) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    bad = {"default": {"BACKEND": TASKS["default"]["BACKEND"], "OPTIONS": {"shema": "x"}}}
    with override_settings(TASKS=bad), pytest.raises(ImproperlyConfigured, match="shema"):
        backend()
