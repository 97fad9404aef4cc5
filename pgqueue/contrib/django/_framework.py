"""Django's Tasks framework, wherever it is installed: ``django.tasks``
(Django 6) or the ``django-tasks`` backport (Django 4.2-5.x).

Names differ between versions (``InvalidTask``/``InvalidTaskError``,
``TaskResultDoesNotExist``/``ResultDoesNotExist``); they are looked up here
once, so the backend has one code path. Importing this module never fails:
``AVAILABLE`` says whether a framework was found.
"""

from __future__ import annotations

import importlib
from dataclasses import fields
from types import ModuleType
from typing import Any

__all__ = [
    "AVAILABLE",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "cancelled_status",
    "import_checks",
    "normalize_json",
    "signals",
    "task_backends",
    "task_result",
]


def _first(*names: str) -> ModuleType | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _attr(module: ModuleType | None, *names: str) -> Any:
    for name in names:
        if module is not None and hasattr(module, name):
            return getattr(module, name)
    return None


_package = _first("django.tasks", "django_tasks")
#: "django.tasks", "django_tasks", or None when neither is installed.
FRAMEWORK: str | None = None if _package is None else _package.__name__
AVAILABLE = FRAMEWORK is not None


class _Unavailable:
    """The base class when no Tasks framework is installed: configuring the
    backend then fails with the fix, while ``import`` of it still works."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "pgqueue.contrib.django.tasks.PgQueueBackend needs Django's Tasks framework: "
            "Django >= 6, or `pip install django-tasks` on Django 4.2-5.x"
        )


_base = _attr(_package, "base") if _package is not None else None
_backends = _first(f"{FRAMEWORK}.backends.base") if AVAILABLE else None
_exceptions = _first(f"{FRAMEWORK}.exceptions") if AVAILABLE else None

BaseTaskBackend: Any = _attr(_backends, "BaseTaskBackend") or _Unavailable
Task: Any = _attr(_package, "Task") or _attr(_base, "Task")
TaskResult: Any = _attr(_package, "TaskResult")
TaskContext: Any = _attr(_package, "TaskContext")
TaskResultStatus: Any = _attr(_package, "TaskResultStatus")
TaskError: Any = _attr(_base, "TaskError")
task_backends: Any = _attr(_package, "task_backends")
InvalidTask: Any = _attr(_exceptions, "InvalidTask", "InvalidTaskError") or ValueError
TaskResultDoesNotExist: Any = (
    _attr(_exceptions, "TaskResultDoesNotExist", "ResultDoesNotExist") or LookupError
)
TaskResultMismatch: Any = _attr(_exceptions, "TaskResultMismatch") or LookupError
signals: Any = _first(f"{FRAMEWORK}.signals") if AVAILABLE else None
normalize_json: Any = _attr(_first("django.utils.json"), "normalize_json") or _attr(
    _first(f"{FRAMEWORK}.utils") if AVAILABLE else None, "normalize_json"
)


def cancelled_status() -> Any:
    """``TaskResultStatus.CANCELLED`` where the installed version has it, else FAILED."""
    return getattr(TaskResultStatus, "CANCELLED", TaskResultStatus.FAILED)


def import_checks() -> None:
    """Register the framework's system check (the backport does so only when
    ``django_tasks`` is in INSTALLED_APPS; Django 6 on import)."""
    if AVAILABLE:
        importlib.import_module(f"{FRAMEWORK}.checks")


def task_result(**values: Any) -> Any:
    """A ``TaskResult`` from the fields this version defines (older backports
    lack some); ``return_value`` is set after construction (it is not a field
    the constructor takes)."""
    return_value = values.pop("return_value", None)
    names = {f.name for f in fields(TaskResult)}
    result = TaskResult(**{k: v for k, v in values.items() if k in names})
    if "_return_value" in names:
        object.__setattr__(result, "_return_value", return_value)
    return result
