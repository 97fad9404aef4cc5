"""Every enqueue path resolves the priority the same way (enqueue_resolve of
sql/schema.sql): the caller's, else an operator's setting, else the task's
declared default, else 0."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

import pgqueue

Path = Callable[[pgqueue.App, int | None], int]


def _one(app: pgqueue.App, priority: int | None) -> int:  # enqueue_job
    return app.enqueue("ranked", {}, priority=priority).job_id


def _labelled(app: pgqueue.App, priority: int | None) -> int:  # enqueue_batch
    return app.enqueue("ranked", {}, priority=priority, tags=["t"]).job_id


def _payloads(app: pgqueue.App, priority: int | None) -> int:  # enqueue_payloads
    specs = [pgqueue.JobSpec("ranked", {"i": i}, priority=priority) for i in range(2)]
    return app.enqueue_many(specs)[0].job_id


def _batch(app: pgqueue.App, priority: int | None) -> int:  # enqueue_batch, dedup keys
    key = f"k{next(_keys)}"  # a new job each time
    specs = [pgqueue.JobSpec("ranked", {}, priority=priority, dedup_key=key)]
    return app.enqueue_many(specs)[0].job_id


_keys = itertools.count()


@pytest.mark.parametrize("path", [_one, _labelled, _payloads, _batch])
def test_priority_precedence_is_the_same_on_every_path(app: pgqueue.App, path: Path) -> None:
    app.task(name="ranked", priority=3)(lambda: None)
    assert app.get_job(path(app, None)).priority == 3  # the task's default
    assert app.get_job(path(app, 1)).priority == 1  # the caller's
    app.set_task_options("ranked", priority=7)
    assert app.get_job(path(app, None)).priority == 7  # the operator's, over the default
    assert app.get_job(path(app, -2)).priority == -2  # the caller's, over both
