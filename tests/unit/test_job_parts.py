"""The parts that run jobs are built in one place from one WorkerApp: the
worker and ``pgqueue.testing.drain`` cannot build them differently, and
what a job's run takes from the App reaches the executor."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pgqueue
from pgqueue.worker.parts import JobParts, WorkerApp
from pgqueue.worker.settings import WorkerSettings

PACKAGE = Path(pgqueue.__file__).parent


def test_job_parts_take_the_app_only_as_one_worker_app() -> None:
    # A part that needs something of the App gets it through WorkerApp: a
    # separate argument (with a default) could be left out by one caller.
    params = inspect.signature(JobParts.build).parameters
    assert list(params) == ["app", "settings", "on_fatal", "stopped"]
    assert params["app"].annotation == "WorkerApp"


def test_the_worker_and_drain_build_their_parts_from_the_app_the_same_way() -> None:
    for module in ("worker/worker.py", "testing/drain.py"):
        source = (PACKAGE / module).read_text(encoding="utf-8")
        assert source.count("JobParts.build(") == 1, module
        assert "WorkerApp.of(app)" in source, module


def test_the_executor_gets_the_apps_middleware_tasks_and_dependency_results() -> None:
    app = pgqueue.App("postgresql://nowhere.invalid/db", middleware=[pgqueue.Middleware()])

    @app.task
    def ping() -> str:
        return "pong"

    async def build() -> JobParts:
        settings = WorkerSettings.build(None, concurrency=1, install_signal_handlers=False)
        parts = JobParts.build(
            WorkerApp.of(app), settings, on_fatal=lambda loop, exc: None, stopped=asyncio.Event()
        )
        parts.executor.close()
        return parts

    parts = asyncio.run(build())
    executor = parts.executor
    assert executor.middleware == tuple(app.middleware)
    assert executor.tasks is app.tasks
    assert executor.dependencies == app.job_dependencies
    assert executor.progress is parts.progress
    assert executor.max_result_bytes == app.max_result_bytes
