"""Django configured in the test process with pgqueue's Tasks backends
(tests/test_django_tasks*.py)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.apps.django_settings import TASKS, database
from tests.fixtures.workers import wait_until

django = pytest.importorskip("django")
fw = importlib.import_module("pgqueue.contrib.django._framework")
if not fw.AVAILABLE:
    pytest.skip("no django.tasks (Django 6) and no django-tasks", allow_module_level=True)

DJANGO_TASKS = "tests.apps.django_tasks"


@pytest.fixture
def tasks(db_dsn: str) -> Iterator[ModuleType]:
    """Django configured in this process with the pgqueue backends on the
    test's database; the module of Django tasks."""
    from django.conf import settings
    from django.db import connections
    from django.test import override_settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["pgqueue.contrib.django"],
            DATABASES={"default": database(db_dsn)},
            USE_TZ=True,
            TASKS=TASKS,
        )
        django.setup()
    connections.close_all()
    connections.settings["default"].update(database(db_dsn))
    # TASKS "changes": Django forgets its backends, pgqueue the Apps of the last test.
    with override_settings(TASKS=TASKS):
        try:
            yield importlib.import_module(DJANGO_TASKS)
        finally:
            connections.close_all()


def backend(alias: str = "default") -> Any:
    return fw.task_backends[alias]


def finished(result: Any, timeout: float = 30) -> Any:
    """``result`` refreshed until its task has finished."""

    def done() -> bool:
        result.refresh()
        return bool(result.is_finished)

    wait_until(done, timeout, f"task result {result.id} to finish")
    return result
