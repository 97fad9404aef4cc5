"""The App that process-pool tests serve: ``pgqueue worker --app
tests.apps.process_pool:app --pool process``.

The worker and each of its children import this module (the children by
the same path) and take the DSN from ``PGQUEUE_DSN``. Tasks report the pid
of the process they ran in (in their result, or in ``public.task_events``
through :func:`tests.apps.tasks.record` before they hang or die), so that a
test can tell children apart and check that a killed one is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pgqueue
from tests.apps.tasks import QUICK_RETRIES, record

#: A task that hangs gives up after this long, so a failed test leaves nothing behind for long.
HANG_LIMIT = 120.0

#: Memory a ``grow`` task keeps for the rest of its child's life.
_kept: list[bytearray] = []


def whoami(context: pgqueue.JobContext) -> dict[str, Any]:
    """Where the task ran and what its context says."""
    context.set_progress({"step": "done"})
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "job_id": context.job_id,
        "attempt": context.attempt,
        "tags": context.tags,
        "meta": context.meta,
        "should_stop": context.should_stop(),
    }


async def on_the_loop() -> int:
    """An async task: runs in the worker process itself."""
    return os.getpid()


def enqueue_from_child(context: pgqueue.JobContext) -> int:
    """Enqueues a job from the child (the App opens its own connection there)."""
    return app.enqueue("whoami", {}, tags=[f"from-{context.job_id}"]).job_id


def sleep_past_timeout(context: pgqueue.JobContext) -> None:
    """Sleeps (ignoring should_stop) far past its 1 s timeout."""
    record("start", "sleep", context.job_id, pid=os.getpid())
    time.sleep(HANG_LIMIT)


def spin_past_timeout(context: pgqueue.JobContext) -> None:
    """A pure-Python busy loop (ignoring should_stop) past its 1 s timeout."""
    record("start", "spin", context.job_id, pid=os.getpid())
    deadline = time.monotonic() + HANG_LIMIT
    n = 0
    while time.monotonic() < deadline:
        n += 1


def die_once(how: str, context: pgqueue.JobContext) -> int:
    """Kills its own child on the first attempt (``exit``, ``sigkill``, ``sigsegv``);
    succeeds on the next."""
    if context.attempt == 1:
        record("start", how, context.job_id, pid=os.getpid())
        if how == "exit":
            os._exit(7)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "sigsegv":
            ctypes.string_at(0)
        raise AssertionError(f"unknown way to die: {how}")
    return os.getpid()


def hold(key: str, honour_stop: bool, context: pgqueue.JobContext) -> str:
    """Runs until should_stop() (when ``honour_stop``) or for HANG_LIMIT seconds."""
    record("start", key, context.job_id, pid=os.getpid())
    deadline = time.monotonic() + HANG_LIMIT
    while time.monotonic() < deadline:
        if honour_stop and context.should_stop():
            record("stopped", key, context.job_id, pid=os.getpid(), should_stop=True)
            return "stopped"
        time.sleep(0.02)
    return "gave up"


def grow(megabytes: int, keep: bool = True) -> int:
    """Touches ``megabytes`` of memory in its child, and keeps it there (``keep``)
    or frees it before returning; returns the child's pid."""
    block = bytearray(megabytes * 1024 * 1024)
    for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
        block[i] = 1
    if keep:
        _kept.append(block)
    del block
    return os.getpid()


def in_transaction(key: str, fail_first: bool, context: pgqueue.JobContext) -> str:
    """Writes a row and completes the job in one transaction (from the child);
    with ``fail_first`` the first attempt raises inside the block."""
    with context.transaction() as conn:
        conn.execute(
            "INSERT INTO public.task_events (kind, key, job_id, pid) VALUES ('tx', %s, %s, %s)",
            (key, context.job_id, os.getpid()),
        )
        if fail_first and context.attempt == 1:
            raise ValueError("rolled back")
    return "not recorded: the job succeeded in its transaction"


def fails() -> None:
    """An ordinary exception in a child: recorded like one in a thread."""
    raise ValueError("bad things")


def durable_in_child(key: str, context: pgqueue.JobContext) -> dict[str, Any]:
    """A durable sync task in a child: a step (run once, recorded), a short
    sleep, a wait for an event, a second step; fails once after the first
    step, so the retry shows the stored step is not run again."""

    def charge() -> int:
        record("charge", key, context.job_id, pid=os.getpid())
        return os.getpid()

    charged_in = context.step("charge", charge)
    if context.attempt == 1:
        raise ValueError("fails once after the step")
    context.sleep("1s")
    paid = context.wait_for_event(f"paid:{key}", timeout="60s")
    total = context.step("total", lambda: paid["amount"] * 2)
    return {"charged_in": charged_in, "total": total, "pid": os.getpid()}


TASKS: dict[Any, dict[str, Any]] = {
    whoami: dict(pass_context=True),
    on_the_loop: dict(),
    enqueue_from_child: dict(pass_context=True),
    sleep_past_timeout: dict(timeout=1, max_attempts=1, pass_context=True),
    spin_past_timeout: dict(timeout=1, max_attempts=1, pass_context=True),
    die_once: dict(max_attempts=3, retry=QUICK_RETRIES, pass_context=True),
    hold: dict(pass_context=True),
    grow: dict(),
    in_transaction: dict(pass_context=True, max_attempts=3, retry=QUICK_RETRIES),
    fails: dict(),
    durable_in_child: dict(pass_context=True, max_attempts=3, retry=QUICK_RETRIES),
}


class WhereMiddleware(pgqueue.Middleware):
    """Records where ``whoami`` runs (around it), and where a job that a task
    enqueued was enqueued (``before_enqueue``, in its meta)."""

    def process(self, context: pgqueue.JobContext, call_next: Callable[[], Any]) -> Any:
        if context.task == "whoami":
            record("middleware", None, context.job_id, pid=os.getpid())
        return call_next()

    def before_enqueue(self, spec: pgqueue.JobSpec) -> pgqueue.JobSpec:
        if spec.tags and spec.tags[0].startswith("from-"):
            return spec._replace(meta={"enqueued_in": os.getpid()})
        return spec


def build_app(dsn: str | None = None) -> pgqueue.App:
    """An App with every task above registered (the tests enqueue through one)."""
    built = pgqueue.App(dsn, middleware=[WhereMiddleware()])
    for func, options in TASKS.items():
        built.task(**options)(func)
    return built


app = build_app(os.environ.get("PGQUEUE_DSN"))
