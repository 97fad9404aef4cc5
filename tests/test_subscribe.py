"""app.subscribe() / subscribe_async(): the public event stream, against a real PostgreSQL.

"Nothing else arrived" is proven without waiting for a timeout: a fence
notification (a ``paused`` event of a queue of its own, sent with
pg_notify after the act) is read, and every event before it is what the
act produced, since one listener delivers notifications in commit order.
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.events import parse
from pgqueue.ops import schedules
from pgqueue.subscribe import APPLICATION_NAME, EventStream
from tests.fixtures.factory import JobFactory

WAIT = 30.0  # seconds: an upper bound for anything to arrive; tests never wait it out
CHANNEL = "pgqueue.pgqueue"


def fence(dsn: str) -> str:
    """Send a fence notification; returns its queue name."""
    queue = f"fence-{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"p:{queue}"))
    return queue


def until_fence(events: EventStream, dsn: str) -> list[pgqueue.JobEvent]:
    """Every event that arrives before a fence sent now."""
    marker = fence(dsn)
    got: list[pgqueue.JobEvent] = []
    while True:
        event = events.get(timeout=WAIT)
        assert event is not None, f"the fence did not arrive within {WAIT}s; got {got}"
        if event.queue == marker:
            return got
        got.append(event)


def next_event(events: EventStream) -> pgqueue.JobEvent:
    event = events.get(timeout=WAIT)
    assert event is not None, f"no event within {WAIT}s"
    return event


def listener_pids(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            (APPLICATION_NAME,),
        ).fetchall()
    return [r[0] for r in rows]


def no_listener_left(dsn: str) -> bool:
    """Whether the listener connections are gone (waits up to WAIT for the server to see it)."""
    deadline = time.monotonic() + WAIT
    while listener_pids(dsn):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def events(app: pgqueue.App) -> Iterator[EventStream]:
    with app.subscribe() as stream:
        yield stream


# --- every path that creates ready work ---------------------------------------


def test_python_enqueue_names_its_one_job(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    job = app.enqueue("t", queue="mail")
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "mail", job.job_id)]


def test_bulk_enqueue_is_one_event_per_queue(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    app.enqueue_many([pgqueue.JobSpec("t", {"i": i}, queue=f"q{i % 2}") for i in range(500)])
    got = until_fence(events, db_dsn)
    assert sorted(got) == [
        pgqueue.JobEvent("enqueued", "q0", None),
        pgqueue.JobEvent("enqueued", "q1", None),
    ]


def test_many_enqueues_in_one_transaction_coalesce(
    app: pgqueue.App, db_dsn: str, events: EventStream
) -> None:
    with psycopg.connect(db_dsn) as caller:
        first = app.enqueue("t", {"i": 0}, queue="loop", conn=caller)
        for i in range(1, 200):
            app.enqueue("t", {"i": i}, queue="loop", conn=caller)
        caller.commit()
    # The first names its job; the 199 others fold into one plain hint.
    assert until_fence(events, db_dsn) == [
        pgqueue.JobEvent("enqueued", "loop", first.job_id),
        pgqueue.JobEvent("enqueued", "loop", None),
    ]


def test_rolled_back_enqueue_sends_nothing(
    app: pgqueue.App, db_dsn: str, events: EventStream
) -> None:
    with psycopg.connect(db_dsn) as caller:
        app.enqueue("t", queue="gone", conn=caller)
        caller.rollback()
    assert until_fence(events, db_dsn) == []


def test_sql_enqueue(events: EventStream, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pgqueue.enqueue('t', queue => 'sql')").fetchone()
    assert row is not None
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "sql", row[0])]


def test_cli_enqueue(events: EventStream, db_dsn: str) -> None:
    from tests.cli_support import run_json

    out = run_json(db_dsn, "enqueue", "t", "--queue", "cli")
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "cli", out["job_id"])]


def test_a_schedule_firing(app: pgqueue.App, events: EventStream, db_dsn: str) -> None:
    app.add_schedule("every-second", "* * * * * *", "t", queue="cron")
    fired: list[int] = []
    for _ in range(300):  # as a worker's scheduler does; the next slot is a second away
        tick = app._database.run(schedules.fire_due(app.op_context, None))
        fired += [job for f in tick.fired for job in f.job_ids]
        if fired:
            break
        events.get(timeout=0.02)
    assert fired, "the schedule did not fire"
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "cron", fired[0])]


def test_a_scheduled_job_when_it_becomes_due(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    job = app.enqueue("t", queue="later", delay=0.5).job_id
    event = next_event(events)  # no worker runs: the listener notices by itself
    assert event == pgqueue.JobEvent("enqueued", "later", job)
    assert app.get_job(job).status == pgqueue.JobStatus.QUEUED  # due by the database clock


def test_a_retry_when_it_becomes_due(app: pgqueue.App, events: EventStream, db_dsn: str) -> None:
    job = app.enqueue("t", queue="retry").job_id
    assert next_event(events) == pgqueue.JobEvent("enqueued", "retry", job)
    (leased,) = app.lease("retry", "w1")
    status = app.fail(leased, "boom", retry_at=_db_now(db_dsn) + timedelta(seconds=0.5))
    assert status == pgqueue.JobStatus.SCHEDULED
    assert next_event(events) == pgqueue.JobEvent("enqueued", "retry", job)
    assert app.get_job(job).status == pgqueue.JobStatus.QUEUED


def test_an_immediate_retry_and_a_nack(app: pgqueue.App, events: EventStream, db_dsn: str) -> None:
    app.enqueue("t", queue="now")
    app.enqueue("t", queue="now")
    until_fence(events, db_dsn)
    first, second = app.lease("now", "w1", max=2)
    app.fail(first, "boom", retry_at=_db_now(db_dsn) - timedelta(seconds=1))
    app.nack(second)
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "now", None)]


def test_a_reaped_job_when_its_retry_becomes_due(
    app: pgqueue.App, events: EventStream, db_dsn: str, job_factory: JobFactory
) -> None:
    job = job_factory.insert(queue="reaped", status="running")  # retried after ~1 s
    job_factory.expire_lease(job)
    assert app.reap() == 1
    assert next_event(events) == pgqueue.JobEvent("enqueued", "reaped", job)


def test_replay_and_requeue_dead(app: pgqueue.App, events: EventStream, db_dsn: str) -> None:
    job = app.enqueue("t", queue="dlq").job_id
    (leased,) = app.lease("dlq", "w1")
    app.fail(leased, "boom", permanent=True)
    until_fence(events, db_dsn)

    copy = app.replay(job)
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "dlq", copy)]
    app.requeue_dead(job)
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "dlq", None)]


def test_pause_resume_and_finished(app: pgqueue.App, events: EventStream, db_dsn: str) -> None:
    app.pause_queue("ctl")
    app.resume_queue("ctl")
    job = app.enqueue("t", queue="ctl").job_id
    with pytest.raises(pgqueue.ResultTimeout):
        app.result(job, timeout=0.01)  # someone waits on it: its end is announced
    (leased,) = app.lease("ctl", "w1")
    app.ack(leased, {"ok": True})
    assert until_fence(events, db_dsn) == [
        pgqueue.JobEvent("paused", "ctl"),
        pgqueue.JobEvent("resumed", "ctl"),
        pgqueue.JobEvent("enqueued", "ctl", job),
        pgqueue.JobEvent("finished", "ctl", job, pgqueue.JobStatus.SUCCEEDED),
    ]
    assert app.result(job, timeout=1) == {"ok": True}


def test_finished_by_cancel_and_dead_letter(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    cancelled = app.enqueue("t", queue="end").job_id
    dead = app.enqueue("t", queue="end", dedup_key="d").job_id
    for job in (cancelled, dead):
        with pytest.raises(pgqueue.ResultTimeout):
            app.result(job, timeout=0.01)
    until_fence(events, db_dsn)
    app.cancel(cancelled)
    (leased,) = app.lease("end", "w1")
    app.fail(leased, "boom", permanent=True)
    assert until_fence(events, db_dsn) == [
        pgqueue.JobEvent("finished", "end", cancelled, pgqueue.JobStatus.CANCELLED),
        pgqueue.JobEvent("finished", "end", dead, pgqueue.JobStatus.DEAD),
    ]


def test_every_cancel_path_sends_finished(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    from pgqueue.dashboard import actions

    one, many, selected = (app.enqueue("t", queue="cxl").job_id for _ in range(3))
    for job in (one, many, selected):
        with pytest.raises(pgqueue.ResultTimeout):
            app.result(job, timeout=0.01)  # someone waits: its finish is announced
    until_fence(events, db_dsn)
    app.cancel(one)
    app.cancel_many([many])  # the CLI's bulk cancel

    async def dashboard_selection() -> None:
        await actions.act_on_ids(app, "cancel", [selected])
        # An async pool must close before its event loop ends (psycopg_pool
        # can hang in asyncio.run's cancellation of its tasks otherwise).
        await app._database.close_async_pool()

    asyncio.run(dashboard_selection())
    cancelled = pgqueue.JobStatus.CANCELLED
    assert until_fence(events, db_dsn) == [
        pgqueue.JobEvent("finished", "cxl", job, cancelled) for job in (one, many, selected)
    ]


def test_a_cascade_cancel_sends_finished(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    first = app.enqueue("t", queue="cxl").job_id
    after = app.enqueue("t", queue="cxl", depends_on=[first]).job_id
    with pytest.raises(pgqueue.ResultTimeout):
        app.result(after, timeout=0.01)  # someone waits on the dependent only
    until_fence(events, db_dsn)
    app.cancel(first)  # the dependent is cancelled in the same transaction
    assert app.get_job(after).status == pgqueue.JobStatus.CANCELLED
    assert until_fence(events, db_dsn) == [
        pgqueue.JobEvent("finished", "cxl", after, pgqueue.JobStatus.CANCELLED)
    ]


def test_worker_only_hints_are_not_events(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    app.set_queue_limit("quiet", concurrency=1)
    app.add_schedule("s", "0 0 1 1 *", "t")
    app.enqueue("t", queue="quiet", delay=3600)  # scheduled, far ahead
    assert until_fence(events, db_dsn) == []


def test_a_due_hint_does_not_swallow_what_arrived_with_it(events: EventStream, db_dsn: str) -> None:
    """Notifications read from the socket in one batch are all handled: a
    'w:' hint (a job stored as scheduled) among them must not drop the rest.
    Sent in one transaction, they arrive together, as they do when the
    listener thread falls behind on a loaded machine (the flake of
    test_worker_only_hints_are_not_events: its fence came in the batch of
    the 'w:quiet' hint and was lost)."""
    marker = f"fence-{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_notify(%(c)s, 'w:quiet'), pg_notify(%(c)s, 'j:after'),"
            " pg_notify(%(c)s, %(fence)s)",
            {"c": CHANNEL, "fence": f"p:{marker}"},
        )
    got = []
    while (event := events.get(timeout=WAIT)) is not None and event.queue != marker:
        got.append(event)
    assert event is not None, f"the fence did not arrive within {WAIT}s; got {got}"
    assert got == [pgqueue.JobEvent("enqueued", "after", None)]


# --- filtering, many subscriptions, async ---------------------------------------------


def test_queue_filter(app: pgqueue.App, db_dsn: str) -> None:
    with app.subscribe(queues=["a", "c"]) as events:
        app.enqueue("t", queue="b")
        job_a = app.enqueue("t", queue="a").job_id
        app.pause_queue("b")
        app.pause_queue("c")
        assert next_event(events) == pgqueue.JobEvent("enqueued", "a", job_a)
        assert next_event(events) == pgqueue.JobEvent("paused", "c")


def test_bad_arguments_are_refused(app: pgqueue.App) -> None:
    with pytest.raises(pgqueue.InvalidName):
        app.subscribe(queues=["no spaces"])
    with pytest.raises(pgqueue.InvalidOption):
        app.subscribe(buffer=0)


def test_many_subscriptions_share_one_connection(app: pgqueue.App, db_dsn: str) -> None:
    streams = [app.subscribe(queues=None if i % 2 else [f"s{i}"]).open() for i in range(40)]
    try:
        assert len(listener_pids(db_dsn)) == 1
        jobs = {i: app.enqueue("t", queue=f"s{i}").job_id for i in range(0, 40, 2)}
        for i, stream in enumerate(streams):
            if i % 2 == 0:
                assert next_event(stream) == pgqueue.JobEvent("enqueued", f"s{i}", jobs[i])
            else:
                got = [next_event(stream) for _ in jobs]
                assert {e.job_id for e in got} == set(jobs.values())
    finally:
        for stream in streams:
            stream.close()
    assert no_listener_left(db_dsn)  # the listener leaves once no subscription needs it
    with app.subscribe() as again:  # and comes back for the next one
        job = app.enqueue("t").job_id
        assert next_event(again) == pgqueue.JobEvent("enqueued", "default", job)


def test_async_subscription(app: pgqueue.App) -> None:
    async def main() -> list[pgqueue.JobEvent]:
        got: list[pgqueue.JobEvent] = []
        async with app.subscribe_async(queues=["aio"]) as events:
            job = await app.enqueue_async("t", queue="aio")
            await app.pause_queue_async("aio")
            async for event in events:
                got.append(event)
                if len(got) == 2:
                    break
            assert got[0] == pgqueue.JobEvent("enqueued", "aio", job.job_id)
            assert await events.get(timeout=0.01) is None
        assert await events.get(timeout=0.01) is None  # closed
        return got

    got = asyncio.run(main())
    assert got[1] == pgqueue.JobEvent("paused", "aio")


def test_iteration_ends_when_the_app_closes(db_dsn: str) -> None:
    app = pgqueue.App(db_dsn)
    events = app.subscribe().open()
    app.close()
    assert list(events) == []


# --- reconnect, slow consumers ----------------------------------------------------------


def test_resync_after_the_listening_backend_is_terminated(
    app: pgqueue.App, events: EventStream, db_dsn: str
) -> None:
    (pid,) = listener_pids(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert next_event(events) == pgqueue.JobEvent("resync")
    assert listener_pids(db_dsn) not in ([], [pid])
    job = app.enqueue("t", queue="after").job_id
    assert until_fence(events, db_dsn) == [pgqueue.JobEvent("enqueued", "after", job)]


def test_a_slow_consumer_gets_a_resync_instead_of_a_backlog(app: pgqueue.App, db_dsn: str) -> None:
    with app.subscribe(queues=["busy"], buffer=5) as slow, app.subscribe() as watcher:
        jobs = [app.enqueue("t", queue="busy").job_id for _ in range(20)]
        # Once the watcher saw them all, the listener handed them to both.
        assert [e.job_id for e in until_fence(watcher, db_dsn)] == jobs
        got = []
        while (event := slow.get(timeout=0)) is not None:
            got.append(event)
        assert len(got) <= 5
        assert pgqueue.JobEvent("resync") in got
        assert slow.dropped >= 15
        # After the resync, the newest events are there, and the stream goes on.
        assert got[-1] == pgqueue.JobEvent("enqueued", "busy", jobs[-1])
        job = app.enqueue("t", queue="busy").job_id
        assert next_event(slow) == pgqueue.JobEvent("enqueued", "busy", job)


# --- poolers --------------------------------------------------------------------------


def test_transaction_pooler_without_listen_dsn_says_it_cannot_listen(db_dsn: str) -> None:
    with pgqueue.App(db_dsn, pooler="transaction") as app:
        with pytest.raises(pgqueue.ListenUnavailable, match="listen_dsn"):
            app.subscribe().open()
        assert app.listen is False
        assert app.listen_dsn is None


def test_transaction_pooler_listens_on_listen_dsn(db_dsn: str) -> None:
    app = pgqueue.App(db_dsn, pooler="transaction", listen_dsn=db_dsn)
    with app, app.subscribe() as events:
        job = app.enqueue("t").job_id
        assert next_event(events) == pgqueue.JobEvent("enqueued", "default", job)


def test_pooler_from_the_environment(db_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQUEUE_POOLER", "transaction")
    monkeypatch.setenv("PGQUEUE_LISTEN_DSN", db_dsn)
    with pgqueue.App(db_dsn) as app:
        assert app.pooler == "transaction"
        assert app.listen_dsn == db_dsn
    monkeypatch.setenv("PGQUEUE_POOLER", "statement")
    with pytest.raises(pgqueue.InvalidOption, match="PGQUEUE_POOLER"):
        pgqueue.App(db_dsn)


def test_subscribing_to_a_server_that_is_down_raises(app: pgqueue.App) -> None:
    down = pgqueue.App("postgresql://nobody@127.0.0.1:1/none")
    with down, pytest.raises(pgqueue.ConnectionFailed):
        down.subscribe().open()


# --- the wire format ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "event"),
    [
        ("j:mail", pgqueue.JobEvent("enqueued", "mail")),
        ("j:a:b#12", pgqueue.JobEvent("enqueued", "a:b", 12)),
        ("p:x", pgqueue.JobEvent("paused", "x")),
        ("r:x", pgqueue.JobEvent("resumed", "x")),
        ("f:7:dead:q:1", pgqueue.JobEvent("finished", "q:1", 7, pgqueue.JobStatus.DEAD)),
        ("f:7", None),
        ("f:7:weird:q", None),
        ("w:q", None),
        ("q:q", None),
        ("c:5", None),
        ("s:name", None),
        ("sentinel:abc", None),
        ("", None),
    ],
)
def test_parse(payload: str, event: pgqueue.JobEvent | None) -> None:
    assert parse(payload) == event


def _db_now(dsn: str):  # type: ignore[no-untyped-def]
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


# --- pgqueue watch ---------------------------------------------------------------------


class Watch:
    """A running ``pgqueue watch``; a thread collects its output lines."""

    def __init__(self, db_dsn: str, *args: str) -> None:
        from tests.cli_support import start_cli

        self.process = start_cli(db_dsn, "watch", *args)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._collect, daemon=True).start()
        for _ in range(600):  # it listens once its connection shows up
            if listener_pids(db_dsn) or self.process.poll() is not None:
                break
            time.sleep(0.05)
        assert self.process.poll() is None, self.process.communicate(timeout=WAIT)

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def line(self) -> str:
        try:
            return self.lines.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"pgqueue watch printed nothing within {WAIT}s")


def _interrupt(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    process.wait(timeout=WAIT)
    assert process.returncode == 0, process.communicate(timeout=WAIT)


def test_cli_watch_prints_json_lines_of_its_queues(app: pgqueue.App, db_dsn: str) -> None:
    watch = Watch(db_dsn, "--queue", "w1", "--queue", "w2", "--json")
    try:
        app.enqueue("t", queue="elsewhere")
        job = app.enqueue("t", queue="w2").job_id
        app.pause_queue("w1")
        assert json.loads(watch.line()) == {
            "kind": "enqueued",
            "queue": "w2",
            "job_id": job,
            "status": None,
        }
        assert json.loads(watch.line())["kind"] == "paused"
    finally:
        _interrupt(watch.process)
    assert no_listener_left(db_dsn)  # Ctrl-C closed its connection


def test_cli_watch_prints_one_line_per_event(app: pgqueue.App, db_dsn: str) -> None:
    watch = Watch(db_dsn)
    try:
        job = app.enqueue("t", queue="human").job_id
        assert watch.line().rstrip().endswith(f" enqueued queue=human job={job}")
    finally:
        watch.process.send_signal(signal.SIGTERM)  # stops like Ctrl-C
        watch.process.wait(timeout=WAIT)
    assert watch.process.returncode == 0


def test_cli_watch_behind_a_transaction_pooler_without_listen_dsn(db_dsn: str) -> None:
    from tests.cli_support import run_cli

    done = run_cli(db_dsn, "--pooler", "transaction", "watch")
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot LISTEN")
    assert "listen_dsn" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_worker_listens_on_listen_dsn_or_polls(db_dsn: str) -> None:
    direct = pgqueue.App(db_dsn)
    assert direct._worker_settings(None, {}).listen is True
    pooled = pgqueue.App(db_dsn, pooler="transaction")
    assert pooled._worker_settings(None, {}).listen is False  # it polls (and logs why)
    assert pooled.listen is False  # result() polls too
    bypass = pgqueue.App(db_dsn, pooler="transaction", listen_dsn=db_dsn)
    assert bypass._worker_settings(None, {}).listen is True
    assert pgqueue.App(db_dsn, pooler="session").listen_dsn == db_dsn
