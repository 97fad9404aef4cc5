"""pgqueue.testing against a real database: what is enqueued, drain through
the worker's execution path, perform, and isolated schemas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.testing import (
    DrainResult,
    assert_enqueued,
    drain,
    drain_async,
    enqueued_jobs,
    isolated,
    perform,
    perform_async,
    refute_enqueued,
)
from pgqueue.testing.isolation import _BOUND, server_for_tests
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)

NO_WAIT = pgqueue.Backoff(base=0, jitter=0)  # retries due at once


# --- enqueued_jobs, assert_enqueued, refute_enqueued ---------------------------------


def test_enqueued_jobs_are_the_jobs_not_run_yet_matched_by_payload_subset(
    app: pgqueue.App,
) -> None:
    @app.task(queue="mail")
    def send(to: str, meta: dict[str, Any]) -> None: ...

    a = send.enqueue(to="a@x", meta={"lang": "en", "vip": True}).job_id
    b = send.with_options(delay=3600).enqueue(to="b@x", meta={"lang": "fr"}).job_id
    c = app.enqueue("other", {"to": "a@x"}).job_id
    [done] = app.lease("mail", "w", max=1)
    assert done.job_id == a
    app.ack(done)  # succeeded: no longer enqueued

    assert [j.id for j in enqueued_jobs(app)] == [b, c]
    assert [j.status for j in enqueued_jobs(app)] == ["scheduled", "queued"]
    assert [j.id for j in enqueued_jobs(app, send)] == [b]
    assert [j.id for j in enqueued_jobs(app, "other")] == [c]
    assert [j.id for j in enqueued_jobs(app, queue="default")] == [c]
    assert [j.id for j in enqueued_jobs(app, payload={"to": "a@x"})] == [c]
    assert [j.id for j in enqueued_jobs(app, payload={"meta": {"lang": "fr"}})] == [b]
    assert enqueued_jobs(app, payload={"meta": {"lang": "en"}}) == []


def test_assert_enqueued_returns_the_jobs_and_checks_the_count(app: pgqueue.App) -> None:
    @app.task
    def ship(order_id: int) -> None: ...

    first = ship.enqueue(order_id=1).job_id
    ship.enqueue(order_id=2)
    assert [j.id for j in assert_enqueued(app, ship, payload={"order_id": 1})] == [first]
    assert len(assert_enqueued(app, "ship", count=2)) == 2
    assert assert_enqueued(app, "nothing", count=0) == []
    with pytest.raises(AssertionError, match="expected 3 enqueued jobs with task='ship'"):
        assert_enqueued(app, ship, count=3)


def test_assert_enqueued_failure_lists_the_closest_jobs_and_what_differs(
    app: pgqueue.App,
) -> None:
    @app.task(queue="mail")
    def send_receipt(order_id: int, email: str) -> None: ...

    near = send_receipt.enqueue(order_id=41, email="a@b.c").job_id
    far = app.enqueue("sync_inventory", {"sku": "X-1"}).job_id

    with pytest.raises(AssertionError) as raised:
        assert_enqueued(app, send_receipt, queue="mail", payload={"order_id": 42})
    message = str(raised.value)
    assert message.splitlines()[:5] == [
        "expected at least 1 enqueued job with task='send_receipt', queue='mail', "
        "payload ⊇ {'order_id': 42}, found 0",
        "enqueued (2, closest first):",
        f"  job {near} send_receipt(queue='mail') queued payload={{'email': 'a@b.c', "
        "'order_id': 41}",
        "      - payload['order_id'] is 41, not 42",
        f"  job {far} sync_inventory(queue='default') queued payload={{'sku': 'X-1'}}",
    ]
    assert "      - task is 'sync_inventory', not 'send_receipt'" in message
    assert "      - queue is 'default', not 'mail'" in message
    assert "payload['order_id'] is missing (expected 42)" in message


def test_assert_enqueued_on_an_empty_queue_says_nothing_is_enqueued(app: pgqueue.App) -> None:
    with pytest.raises(AssertionError) as raised:
        assert_enqueued(app, "ship")
    assert str(raised.value) == (
        "expected at least 1 enqueued job with task='ship', found 0\n"
        "nothing is enqueued (queued, scheduled or waiting) in schema 'pgqueue'"
    )


def test_refute_enqueued_lists_the_jobs_that_match(app: pgqueue.App) -> None:
    job_id = app.enqueue("ship", {"order_id": 7}, delay=60).job_id
    refute_enqueued(app, "ship", payload={"order_id": 8})
    refute_enqueued(app, "ship", queue="other")
    with pytest.raises(AssertionError) as raised:
        refute_enqueued(app, "ship", payload={"order_id": 7})
    lines = str(raised.value).splitlines()
    assert lines[0] == (
        "expected no enqueued job with task='ship', payload ⊇ {'order_id': 7}, found 1"
    )
    assert lines[1] == "enqueued (1, closest first):"
    assert lines[2].startswith(f"  job {job_id} ship(queue='default') scheduled, run_at 20")
    assert lines[2].endswith("payload={'order_id': 7}")


def test_a_long_listing_is_cut_after_ten_jobs(app: pgqueue.App) -> None:
    app.enqueue_many([pgqueue.JobSpec("ship", {"n": n}) for n in range(13)])
    with pytest.raises(AssertionError) as raised:
        assert_enqueued(app, "ship", count=1)
    assert str(raised.value).endswith("  ... and 3 more")


# --- drain ---------------------------------------------------------------------------


def _statuses(app: pgqueue.App) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for job in app.list_jobs(limit=1000).jobs:
        found.setdefault(job.task, []).append(job.status.value)
    return found


def test_drain_runs_jobs_and_the_jobs_they_enqueue_storing_results(app: pgqueue.App) -> None:
    @app.task(queue="orders")
    def checkout(order_id: int) -> dict[str, int]:
        receipt.enqueue(order_id=order_id)
        return {"order_id": order_id}

    @app.task(queue="mail", pass_context=True)
    async def receipt(order_id: int, context: pgqueue.JobContext) -> str:
        await asyncio.sleep(0)
        return f"receipt {order_id} attempt {context.attempt}"

    job_id = checkout.enqueue(order_id=42).job_id
    assert drain(app) == DrainResult(succeeded=2)
    assert app.get_job(job_id).result == {"order_id": 42}
    [sent] = app.list_jobs(task="receipt").jobs
    assert sent.status == "succeeded"
    assert app.result(sent.id) == "receipt 42 attempt 1"
    assert enqueued_jobs(app) == []
    assert drain(app) == DrainResult()


def test_drain_counts_failed_attempts_retried_and_dead_jobs(app: pgqueue.App) -> None:
    @app.task(max_attempts=3, retry=NO_WAIT)
    def flaky() -> None:
        raise ValueError("still broken")

    @app.task
    def refuses() -> None:
        raise pgqueue.Permanent("bad order")

    @app.task(pass_context=True, max_attempts=5, retry=NO_WAIT)
    def second_time_lucky(context: pgqueue.JobContext) -> int:
        if context.attempt < 2:
            raise ConnectionError("flaky network")
        return context.attempt

    flaky_id = flaky.enqueue().job_id
    refuses.enqueue()
    lucky_id = second_time_lucky.enqueue().job_id
    # Retries (due at once here) wait for the next drain: a drain runs what
    # was due when it began.
    assert drain(app) == DrainResult(failed=2, dead=1)
    assert drain(app) == DrainResult(succeeded=1, failed=1)
    result = drain(app)
    assert result == DrainResult(dead=1)
    assert result.total == 1
    assert drain(app) == DrainResult()

    job = app.get_job(flaky_id, history=True)
    assert (job.status, job.attempts) == ("dead", 3)
    assert [a.outcome for a in job.attempt_history or []] == ["failed"] * 3
    assert "still broken" in (job.last_error or "")
    assert app.get_job(lucky_id).result == 2
    assert _statuses(app) == {
        "flaky": ["dead"],
        "refuses": ["dead"],
        "second_time_lucky": ["succeeded"],
    }


def test_drain_leaves_future_retries_and_scheduled_jobs_unless_with_scheduled(
    app: pgqueue.App,
) -> None:
    @app.task(pass_context=True)
    def later(context: pgqueue.JobContext) -> int:
        if context.attempt == 1:
            raise pgqueue.Retry(delay=timedelta(hours=2))
        return context.attempt

    @app.task
    def reminder() -> str:
        return "remind"

    retried = later.enqueue().job_id
    scheduled = reminder.with_options(delay=timedelta(days=3)).enqueue().job_id
    assert drain(app) == DrainResult(failed=1)
    assert [(j.id, j.status) for j in enqueued_jobs(app)] == [
        (retried, "scheduled"),
        (scheduled, "scheduled"),
    ]

    assert drain(app, with_scheduled=True) == DrainResult(succeeded=2)
    assert enqueued_jobs(app) == []
    assert app.get_job(retried).result == 2
    assert app.get_job(scheduled).result == "remind"
    # The attempts are recorded at the time the drain's clock jumped to.
    [attempt] = app.get_job(scheduled, history=True).attempt_history or []
    assert attempt.started_at is not None
    assert attempt.started_at > datetime.now(UTC) + timedelta(days=2)


def test_drain_with_scheduled_runs_the_retries_too(app: pgqueue.App) -> None:
    @app.task(pass_context=True, max_attempts=3, retry=pgqueue.Backoff(base=30, jitter=0))
    def flaky(context: pgqueue.JobContext) -> int:
        if context.attempt < 3:
            raise ConnectionError("flaky network")
        return context.attempt

    job_id = flaky.enqueue().job_id
    result = drain(app, with_scheduled=True)
    assert result == DrainResult(succeeded=1, failed=2)
    assert result.total == 3
    assert app.get_job(job_id).result == 3


def test_drain_counts_snoozes_apart_from_failures(app: pgqueue.App) -> None:
    snoozed: list[int] = []

    @app.task(timeout=0.2, max_attempts=3, retry=pgqueue.Backoff(base=60, jitter=0))
    async def slow() -> None:
        await asyncio.sleep(30)

    @app.task(pass_context=True)
    def not_now(context: pgqueue.JobContext) -> str:
        if context.job_id not in snoozed:
            snoozed.append(context.job_id)
            raise pgqueue.Snooze()  # due again at once, but not in this drain
        return "done"

    first, second = slow.enqueue().job_id, slow.enqueue().job_id
    later = not_now.enqueue().job_id
    result = drain(app)
    assert result == DrainResult(failed=2, snoozed=1)
    assert result.total == 3
    assert [app.get_job(i).attempts for i in (first, second, later)] == [1, 1, 0]
    assert app.get_job(later, history=True).snoozes == 1

    # The snooze is due by the next drain; the retries are a minute away.
    assert drain(app) == DrainResult(succeeded=1)
    assert app.get_job(later).result == "done"
    assert [j.id for j in enqueued_jobs(app)] == [first, second]


def test_drain_runs_what_was_due_when_it_began_whatever_the_jobs_take(
    app: pgqueue.App,
) -> None:
    @app.task(queue="q")
    def slow_checkout(order_id: int) -> None:
        time.sleep(0.6)  # longer than the delay of the reminder below
        receipt.enqueue(order_id=order_id)  # enqueued for now: this drain runs it

    @app.task(queue="q")
    def receipt(order_id: int) -> int:
        return order_id

    @app.task(queue="q")
    def reminder() -> str:
        return "remind"

    checkout_id = slow_checkout.enqueue(order_id=7).job_id
    # Due while the drain runs, but not when it began: left for the next one.
    reminder_id = reminder.with_options(delay=0.3).enqueue().job_id
    assert drain(app) == DrainResult(succeeded=2)
    assert app.get_job(checkout_id).status == "succeeded"
    [sent] = app.list_jobs(task="receipt")
    assert (sent.status, sent.result) == ("succeeded", 7)
    assert app.get_job(reminder_id).status == "queued"  # due by now
    assert drain(app) == DrainResult(succeeded=1)


def test_a_retry_due_at_once_does_not_stop_the_jobs_behind_it(app: pgqueue.App) -> None:
    @app.task(pass_context=True)
    def busy(context: pgqueue.JobContext) -> int:
        if context.attempt == 1:
            raise pgqueue.Retry()  # due at once: ahead of the receipt enqueued below
        return context.attempt

    @app.task
    def checkout(order_id: int) -> None:
        receipt.enqueue(order_id=order_id)

    @app.task
    def receipt(order_id: int) -> int:
        return order_id

    busy_id = busy.enqueue().job_id
    checkout.enqueue(order_id=3)
    # The retry stands before the receipt in the queue: the drain holds it
    # leased, unrun, to reach the receipt, and hands it back at its end.
    assert drain(app) == DrainResult(succeeded=2, failed=1)
    [sent] = app.list_jobs(task="receipt")
    assert (sent.status, sent.result) == ("succeeded", 3)
    held = app.get_job(busy_id, history=True)
    assert (held.status, held.attempts) == ("queued", 1)
    assert [a.outcome for a in held.attempt_history or []] == ["retry", "released"]
    assert drain(app) == DrainResult(succeeded=1)
    assert app.get_job(busy_id).result == 2


def test_a_drain_as_a_worker_role_runs_what_was_due_when_it_began(
    app: pgqueue.App,
    db_dsn: str,
    roles: Roles,  # noqa: F811
) -> None:
    # The cut-off needs no clock override: it works for a role that does not
    # own the schema (one `pgqueue grant --worker` made).
    worker = roles.create(db_dsn, "pgq_drainer", kind="worker")
    with pgqueue.App(worker.dsn) as as_worker:

        @as_worker.task(pass_context=True)
        def busy(context: pgqueue.JobContext) -> int:
            if context.attempt == 1:
                raise pgqueue.Retry()
            return context.attempt

        @as_worker.task
        def checkout(order_id: int) -> None:
            receipt.enqueue(order_id=order_id)

        @as_worker.task
        def receipt(order_id: int) -> int:
            return order_id

        busy_id = app.enqueue("busy").job_id
        app.enqueue("checkout", {"order_id": 4})
        assert drain(as_worker) == DrainResult(succeeded=2, failed=1)
        assert app.get_job(busy_id).status == "queued"
        assert drain(as_worker) == DrainResult(succeeded=1)
    assert [j.status for j in app.list_jobs()] == ["succeeded"] * 3


def test_drain_runs_one_queue(app: pgqueue.App) -> None:
    @app.task(queue="a")
    def in_a() -> None: ...

    @app.task(queue="b")
    def in_b() -> None: ...

    in_a.enqueue()
    b_id = in_b.enqueue().job_id
    assert drain(app, "a") == DrainResult(succeeded=1)
    assert [j.id for j in enqueued_jobs(app)] == [b_id]
    assert drain(app, ["a", "b"]) == DrainResult(succeeded=1)


def test_drain_stops_after_max_jobs(app: pgqueue.App) -> None:
    @app.task
    def forever(n: int) -> None:
        forever.enqueue(n=n + 1)

    forever.enqueue(n=0)
    assert drain(app, max_jobs=3) == DrainResult(succeeded=3)
    [left] = enqueued_jobs(app, forever)
    assert left.payload == {"n": 3}


def test_drain_applies_timeouts_and_kills_unknown_tasks(app: pgqueue.App) -> None:
    @app.task(timeout=0.2, max_attempts=1)
    async def slow() -> None:
        await asyncio.sleep(30)

    slow_id = slow.enqueue().job_id
    ghost_id = app.enqueue("not_in_this_app", {}).job_id
    assert drain(app) == DrainResult(dead=2)
    slow_job = app.get_job(slow_id, history=True)
    assert [a.outcome for a in slow_job.attempt_history or []] == ["timeout"]
    assert "exceeded its timeout of 0.2s" in (slow_job.last_error or "")
    assert "no task named 'not_in_this_app'" in (app.get_job(ghost_id).last_error or "")


class Recording(pgqueue.Middleware):
    """Records around each run and stores ``{"wrapped": result}``."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def process(self, context: pgqueue.JobContext, call_next: Callable[[], Any]) -> Any:
        self.calls.append(f"in {context.task} {context.tags}")
        try:
            return {"wrapped": call_next()}
        finally:
            self.calls.append(f"out {context.task}")

    async def process_async(
        self, context: pgqueue.JobContext, call_next: Callable[[], Awaitable[Any]]
    ) -> Any:
        self.calls.append(f"in {context.task} {context.tags}")
        try:
            return {"wrapped": await call_next()}
        finally:
            self.calls.append(f"out {context.task}")

    def before_enqueue(self, spec: pgqueue.JobSpec) -> pgqueue.JobSpec:
        return spec._replace(tags=[*(spec.tags or []), "svc:orders"])


def test_drain_runs_the_apps_middleware_and_stores_what_it_returns(app: pgqueue.App) -> None:
    calls: list[str] = []
    app.add_middleware(Recording(calls))

    @app.task
    def price(n: int) -> int:
        calls.append("process price")
        return n

    @app.task
    async def async_price(n: int) -> int:
        calls.append("process async_price")
        return n

    sync_id = price.enqueue(n=7).job_id
    async_id = async_price.enqueue(n=8).job_id
    assert drain(app) == DrainResult(succeeded=2)
    assert calls == [
        "in price ['svc:orders']", "process price", "out price",
        "in async_price ['svc:orders']", "process async_price", "out async_price",
    ]  # fmt: skip
    assert app.get_job(sync_id).result == {"wrapped": 7}
    assert app.result(async_id) == {"wrapped": 8}


def test_under_drain_a_tasks_timeout_covers_its_middleware(app: pgqueue.App) -> None:
    class Slow(pgqueue.Middleware):
        async def process_async(
            self, context: pgqueue.JobContext, call_next: Callable[[], Awaitable[Any]]
        ) -> Any:
            await asyncio.sleep(30)
            return await call_next()

    app.add_middleware(Slow())

    @app.task(timeout=0.2, max_attempts=1)
    async def quick() -> str:
        return "never reached"

    job_id = quick.enqueue().job_id
    assert drain(app) == DrainResult(dead=1)
    job = app.get_job(job_id, history=True)
    # Not covered, the middleware would call the task after 30 s: succeeded.
    assert [a.outcome for a in job.attempt_history or []] == ["timeout"]


def test_drain_runs_workflow_steps_that_read_their_dependencies_results(
    app: pgqueue.App,
) -> None:
    @app.task
    def fetch_order(order_id: int) -> dict[str, int]:
        return {"order_id": order_id, "total_cents": 1999}

    @app.task(pass_context=True)
    async def charge_card(context: pgqueue.JobContext) -> int:
        return int(context.dependency_results()["fetch_order"]["total_cents"])

    @app.task(pass_context=True)
    def ship_order(context: pgqueue.JobContext) -> dict[str, Any]:
        return {"seen": context.dependency_results(), "workflow": context.workflow_id}

    wf = app.workflow("checkout-42")
    fetch = wf.add(fetch_order, {"order_id": 42})
    charge = wf.add(charge_card, after=fetch)
    wf.add(ship_order, after=[fetch, charge])
    run = wf.enqueue()

    assert drain(app) == DrainResult(succeeded=3)
    assert app.get_workflow(run.workflow_id).status == "succeeded"
    assert app.result(run.jobs["charge_card"]) == 1999
    assert app.result(run.jobs["ship_order"]) == {
        "seen": {"fetch_order": {"order_id": 42, "total_cents": 1999}, "charge_card": 1999},
        "workflow": run.workflow_id,
    }


def test_drain_stores_progress_as_a_worker_does(app: pgqueue.App) -> None:
    @app.task(pass_context=True)
    def import_rows(context: pgqueue.JobContext) -> None:
        context.set_progress({"done": 10, "total": 10})

    job_id = import_rows.enqueue().job_id
    assert drain(app) == DrainResult(succeeded=1)
    assert app.get_job(job_id).progress == {"done": 10, "total": 10}


def test_drain_counts_a_job_cancelled_while_it_ran(app: pgqueue.App) -> None:
    @app.task(pass_context=True)
    def cancels_itself(context: pgqueue.JobContext) -> None:
        app.cancel(context.job_id)

    job_id = cancels_itself.enqueue().job_id
    assert drain(app) == DrainResult(cancelled=1)
    assert app.get_job(job_id).status == "cancelled"


def test_drain_completes_in_the_tasks_transaction_and_leaves_no_worker(
    app: pgqueue.App, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE shipped (order_id int)")

    @app.task(pass_context=True)
    def ship(order_id: int, context: pgqueue.JobContext) -> None:
        with context.transaction() as tx:
            tx.execute("INSERT INTO shipped VALUES (%s)", (order_id,))

    job_id = ship.enqueue(order_id=5).job_id
    assert drain(app) == DrainResult(succeeded=1)
    assert app.get_job(job_id).status == "succeeded"
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT order_id FROM shipped").fetchall() == [(5,)]
    assert [w for w in app.list_workers() if w.status != "stopped"] == []


def test_drain_async_runs_on_the_callers_loop(app: pgqueue.App) -> None:
    @app.task
    async def hello(name: str) -> str:
        return f"hello {name}"

    async def main() -> DrainResult:
        await hello.enqueue_async(name="x")
        with pytest.raises(RuntimeError, match="drain_async"):
            drain(app)
        result = await drain_async(app)
        await app.close_async()
        return result

    assert asyncio.run(main()) == DrainResult(succeeded=1)


def test_drain_refuses_bad_arguments(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.InvalidName):
        drain(app, "no spaces allowed")
    with pytest.raises(pgqueue.InvalidOption):
        drain(app, max_jobs=0)


# --- perform -------------------------------------------------------------------------


def test_perform_runs_a_task_with_a_context_and_a_json_payload(app: pgqueue.App) -> None:
    seen: list[Any] = []

    @app.task(queue="mail", pass_context=True)
    def send(items: list[int], context: pgqueue.JobContext) -> str:
        seen.append((items, context.attempt, context.queue, context.task, context.should_stop()))
        return "sent"

    assert perform(send, {"items": (1, 2)}, attempt=3) == "sent"
    assert seen == [([1, 2], 3, "mail", "send", False)]
    with pytest.raises(pgqueue.InvalidPayload):
        perform(send, {"items": object()})


def test_perform_lets_exceptions_through_and_runs_async_tasks(app: pgqueue.App) -> None:
    @app.task
    def fails() -> None:
        raise pgqueue.Retry(delay=5)

    @app.task
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    with pytest.raises(pgqueue.Retry):
        perform(fails)
    assert perform(double, {"n": 4}) == 8

    async def main() -> tuple[int, int]:
        with pytest.raises(RuntimeError, match="perform_async"):
            perform(double, {"n": 1})
        sync_double = app.task(lambda n: 2 * n, name="sync_double")
        return await perform_async(double, {"n": 5}), await perform_async(sync_double, {"n": 6})

    assert asyncio.run(main()) == (10, 12)
    assert enqueued_jobs(app) == []  # perform writes nothing


def test_perform_runs_the_apps_middleware_around_sync_and_async_tasks(
    app: pgqueue.App,
) -> None:
    calls: list[str] = []
    app.add_middleware(Recording(calls))

    @app.task(pass_context=True)
    def price(n: int, context: pgqueue.JobContext) -> int:
        calls.append(f"process {context.task} attempt {context.attempt}")
        return n

    @app.task
    async def async_price(n: int) -> int:
        calls.append("process async_price")
        return n

    assert perform(price, {"n": 7}, attempt=2) == {"wrapped": 7}
    assert perform(async_price, {"n": 8}) == {"wrapped": 8}
    assert asyncio.run(perform_async(price, {"n": 9})) == {"wrapped": 9}
    assert calls == [
        "in price []", "process price attempt 2", "out price",
        "in async_price []", "process async_price", "out async_price",
        "in price []", "process price attempt 1", "out price",
    ]  # fmt: skip
    assert enqueued_jobs(app) == []


# --- isolated schemas ----------------------------------------------------------------


def _schemas(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgqueue%' ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def test_isolated_points_the_app_at_a_fresh_schema_and_drops_it(
    app: pgqueue.App, db_dsn: str
) -> None:
    @app.task
    def ship(order_id: int) -> None: ...

    outside = ship.enqueue(order_id=1).job_id
    with isolated(app) as same:
        assert same is app
        inside = app.schema
        assert inside.startswith("pgqueue_test_")
        assert _schemas(db_dsn) == sorted(["pgqueue", inside])
        assert enqueued_jobs(app) == []
        ship.enqueue(order_id=2)
        assert drain(app) == DrainResult(succeeded=1)
    assert _schemas(db_dsn) == ["pgqueue"]
    assert app.schema == "pgqueue"
    assert [j.id for j in enqueued_jobs(app)] == [outside]


def test_isolated_keeps_the_apps_middleware_tasks_and_clock(app: pgqueue.App) -> None:
    calls: list[str] = []
    app.add_middleware(Recording(calls))

    @app.task(queue="orders", max_attempts=7)
    def ship(order_id: int) -> int:
        return order_id

    before = app.op_context
    with isolated(app):
        inside = app.op_context
        # Only where the app points changed.
        assert (inside.schema, inside.queries.schema) == (app.schema, app.schema)
        for name in ("max_payload_bytes", "max_result_bytes", "task_defaults", "clock"):
            assert getattr(inside, name) == getattr(before, name), name
        assert inside.middleware is app.middleware
        job_id = ship.enqueue(order_id=5).job_id
        job = app.get_job(job_id)
        assert (job.tags, job.queue, job.max_attempts) == (["svc:orders"], "orders", 7)
        assert drain(app) == DrainResult(succeeded=1)
        assert app.result(job_id) == {"wrapped": 5}
        assert calls == ["in ship ['svc:orders']", "out ship"]
    assert app.op_context is before


def test_isolated_drops_the_schema_when_the_test_fails(app: pgqueue.App, db_dsn: str) -> None:
    def failing_test() -> None:
        with isolated(app):
            app.enqueue("x", {})
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        failing_test()
    assert _schemas(db_dsn) == ["pgqueue"]


def test_isolated_swaps_everything_an_app_derives_from_its_schema() -> None:
    # An attribute added to App that depends on the schema or DSN must be swapped too.
    one = pgqueue.App("postgresql://h1/a", "one")
    two = pgqueue.App("postgresql://h2/b", "two")
    differing = {
        name
        for name, value in vars(one).items()
        if name not in ("tasks", "periodic_schedules")
        and not callable(value)
        and value != vars(two)[name]
    }
    assert differing <= set(_BOUND)


def test_server_for_tests_prefers_the_environment_and_else_may_have_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pgqueue import embedded

    monkeypatch.setenv("PGQUEUE_TEST_DSN", "postgresql://somewhere/db")
    with server_for_tests() as dsn:
        assert dsn == "postgresql://somewhere/db"
    monkeypatch.delenv("PGQUEUE_TEST_DSN")

    def missing() -> None:
        raise embedded.EmbeddedUnavailable("not installed")

    monkeypatch.setattr(embedded, "bindir", missing)
    with server_for_tests() as dsn:
        assert dsn is None
