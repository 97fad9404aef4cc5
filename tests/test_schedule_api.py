"""The schedule API of App: add (upsert), list, get, enable, disable, remove,
run now, @app.periodic, their async twins, and clear errors that write nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

import pgqueue
from pgqueue.ops import schedules
from tests.fixtures.dbstate import snapshot


class Clock:
    """A frozen database clock for an App (``None``: the real one)."""

    def __init__(self) -> None:
        self.now: datetime | None = None

    def __call__(self) -> datetime | None:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def frozen(db_dsn: str, clock: Clock) -> Iterator[pgqueue.App]:
    with pgqueue.App(dsn=db_dsn, clock=clock) as frozen_app:
        yield frozen_app


def revision(dsn: str, name: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT revision FROM pgqueue.schedules WHERE name = %s", (name,))
        return int(row.fetchone()[0])  # type: ignore[index]


def jobs(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return list(cur.execute("SELECT * FROM pgqueue.jobs ORDER BY id").fetchall())


# --- add / list / get ------------------------------------------------------------------


def test_add_then_list_and_get(app: pgqueue.App) -> None:
    added = app.add_schedule(
        "nightly",
        "30 2 * * *",
        "report",
        {"kind": "daily"},
        queue="reports",
        timezone="Europe/Berlin",
        priority=5,
        max_attempts=2,
    )
    assert isinstance(added, pgqueue.Schedule)
    assert (added.name, added.cron, added.timezone, added.task) == (
        "nightly",
        "30 2 * * *",
        "Europe/Berlin",
        "report",
    )
    assert (added.queue, added.payload, added.priority, added.max_attempts) == (
        "reports",
        {"kind": "daily"},
        5,
        2,
    )
    assert added.enabled
    assert added.next_fire_at is not None
    berlin = added.next_fire_at.astimezone(ZoneInfo("Europe/Berlin"))
    assert berlin.strftime("%H:%M") in ("02:30", "03:00")  # 03:00 on a spring-forward day
    assert (added.last_fire_at, added.last_job_id) == (None, None)
    assert app.list_schedules() == [added]
    assert app.get_schedule("nightly") == added


def test_defaults_are_utc_and_the_tasks_own_options(app: pgqueue.App) -> None:
    added = app.add_schedule("s", "*/5 * * * *", "t")
    assert (added.timezone, added.queue, added.priority, added.max_attempts) == (
        "UTC",
        None,
        None,
        None,
    )
    assert added.payload == {}
    assert added.next_fire_at is not None
    assert added.next_fire_at.minute % 5 == 0
    assert added.next_fire_at.second == 0


def test_the_next_fire_time_comes_from_the_database_clock(
    frozen: pgqueue.App, clock: Clock
) -> None:
    clock.now = datetime(2030, 1, 1, 11, 59, 30, tzinfo=UTC)
    added = frozen.add_schedule("s", "0 * * * *", "t")
    assert added.next_fire_at == datetime(2030, 1, 1, 12, tzinfo=UTC)


def test_list_is_sorted_by_name(app: pgqueue.App) -> None:
    for name in ("b", "c", "a"):
        app.add_schedule(name, "* * * * *", "t")
    assert [s.name for s in app.list_schedules()] == ["a", "b", "c"]


# --- the upsert ----------------------------------------------------------------------


def test_add_again_updates_and_keeps_a_missed_slot(frozen: pgqueue.App, clock: Clock) -> None:
    clock.now = datetime(2030, 1, 1, 11, 59, tzinfo=UTC)
    first = frozen.add_schedule("s", "0 * * * *", "t", {"v": 1})
    clock.now = datetime(2030, 1, 1, 15, 30, tzinfo=UTC)  # 12:00..15:00 not fired yet
    changed = frozen.add_schedule("s", "0 * * * *", "t", {"v": 2}, priority=3)
    assert (changed.payload, changed.priority) == ({"v": 2}, 3)
    # Same cron and zone: the slot a down scheduler missed is kept (it fires once later).
    assert changed.next_fire_at == first.next_fire_at == datetime(2030, 1, 1, 12, tzinfo=UTC)
    recron = frozen.add_schedule("s", "30 * * * *", "t", {"v": 2}, priority=3)
    assert recron.next_fire_at == datetime(2030, 1, 1, 16, 30, tzinfo=UTC)
    retimed = frozen.add_schedule(
        "s", "30 * * * *", "t", {"v": 2}, priority=3, timezone="Asia/Kolkata"
    )
    assert retimed.next_fire_at == datetime(2030, 1, 1, 16, 0, tzinfo=UTC)  # 21:30 IST
    assert len(frozen.list_schedules()) == 1


def test_add_unchanged_writes_nothing(app: pgqueue.App, db_dsn: str) -> None:
    first = app.add_schedule("s", "* * * * *", "t", {"a": [1, 2]}, queue="q")
    before = snapshot(db_dsn)
    again = app.add_schedule("s", "* * * * *", "t", {"a": [1, 2]}, queue="q")
    assert again == first
    assert snapshot(db_dsn) == before
    assert revision(db_dsn, "s") == 1


def test_add_without_replace_refuses_an_existing_name(app: pgqueue.App, db_dsn: str) -> None:
    app.add_schedule("s", "* * * * *", "t")
    before = snapshot(db_dsn)
    with pytest.raises(pgqueue.DuplicateSchedule, match="'s' already exists"):
        app.add_schedule("s", "0 0 * * *", "other", replace=False)
    assert snapshot(db_dsn) == before
    created = app.add_schedule("fresh", "* * * * *", "t", replace=False)
    assert created.name == "fresh"


# --- bad input ------------------------------------------------------------------------


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"cron": "* * * *"}, pgqueue.InvalidCron, "4 fields"),
    ({"cron": "61 * * * *"}, pgqueue.InvalidCron, "61"),
    ({"cron": "0 0 30 2 *"}, pgqueue.InvalidCron, "cron expression"),
    ({"cron": 5}, pgqueue.InvalidCron, "string"),
    ({"timezone": "Mars/Olympus"}, pgqueue.InvalidTimezone, "Mars/Olympus"),
    ({"timezone": ""}, pgqueue.InvalidTimezone, "time zone"),
    ({"name": ""}, pgqueue.InvalidName, "schedule name"),
    ({"name": "a\nb"}, pgqueue.InvalidName, "control"),
    ({"name": "x" * 300}, pgqueue.InvalidName, "255"),
    ({"task": ""}, pgqueue.InvalidName, "task name"),
    ({"payload": [1]}, pgqueue.InvalidPayload, "JSON object"),
    ({"payload": {"x": object()}}, pgqueue.InvalidPayload, "serialisable"),
    ({"payload": {"x": "\x00"}}, pgqueue.InvalidPayload, "NUL"),
    ({"queue": "no spaces"}, pgqueue.InvalidName, "queue name"),
    ({"priority": 40000}, pgqueue.InvalidOption, "priority"),
    ({"priority": "high"}, pgqueue.InvalidOption, "priority"),
    ({"max_attempts": -1}, pgqueue.InvalidOption, "max_attempts"),  # 0: unlimited
    ({"enabled": "yes"}, pgqueue.InvalidOption, "enabled"),
]


@pytest.mark.parametrize(("change", "error", "message"), BAD)
def test_bad_input_is_rejected_and_writes_nothing(
    app: pgqueue.App, db_dsn: str, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    app.add_schedule("existing", "* * * * *", "t")
    before = snapshot(db_dsn)
    arguments: dict[str, Any] = {"name": "existing", "cron": "* * * * *", "task": "t"} | change
    with pytest.raises(error, match=message):
        app.add_schedule(**arguments)
    assert snapshot(db_dsn) == before
    assert issubclass(error, ValueError | TypeError)


def test_payload_over_the_apps_limit_is_rejected(db_dsn: str) -> None:
    with pgqueue.App(dsn=db_dsn, max_payload_bytes=100) as small:
        with pytest.raises(pgqueue.PayloadTooLarge):
            small.add_schedule("s", "* * * * *", "t", {"x": "y" * 200})
        assert small.list_schedules() == []


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.get_schedule("nope"),
        lambda a: a.enable_schedule("nope"),
        lambda a: a.disable_schedule("nope"),
        lambda a: a.remove_schedule("nope"),
        lambda a: a.run_schedule_now("nope"),
    ],
    ids=["get", "enable", "disable", "remove", "run"],
)
def test_unknown_name_is_schedule_not_found_and_writes_nothing(
    app: pgqueue.App, db_dsn: str, call: Any
) -> None:
    app.add_schedule("other", "* * * * *", "t")
    before = snapshot(db_dsn)
    with pytest.raises(pgqueue.ScheduleNotFound, match="'nope'"):
        call(app)
    assert snapshot(db_dsn) == before


# --- enable / disable / remove / run now -------------------------------------------------


def test_disable_then_enable_starts_from_the_next_slot(frozen: pgqueue.App, clock: Clock) -> None:
    clock.now = datetime(2030, 1, 1, 9, 0, 30, tzinfo=UTC)
    frozen.add_schedule("s", "* * * * *", "t")
    disabled = frozen.disable_schedule("s")
    assert (disabled.enabled, disabled.next_fire_at) == (False, None)
    assert frozen.disable_schedule("s").enabled is False  # idempotent
    clock.now = datetime(2030, 1, 1, 10, 0, 30, tzinfo=UTC)
    enabled = frozen.enable_schedule("s")
    # The hour it was disabled never fires: it starts at the next slot.
    assert (enabled.enabled, enabled.next_fire_at) == (
        True,
        datetime(2030, 1, 1, 10, 1, tzinfo=UTC),
    )
    clock.now = datetime(2030, 1, 1, 10, 5, tzinfo=UTC)
    assert frozen.enable_schedule("s").next_fire_at == enabled.next_fire_at  # already enabled


def test_add_disabled(app: pgqueue.App) -> None:
    added = app.add_schedule("s", "* * * * *", "t", enabled=False)
    assert (added.enabled, added.next_fire_at) == (False, None)


def test_remove(app: pgqueue.App) -> None:
    app.add_schedule("s", "* * * * *", "t")
    job_id = app.run_schedule_now("s").job_id
    app.remove_schedule("s")
    assert app.list_schedules() == []
    assert app.get_job(job_id).task == "t"  # its jobs stay
    with pytest.raises(pgqueue.ScheduleNotFound):
        app.remove_schedule("s")


def test_run_now_enqueues_one_job_with_the_schedules_options(app: pgqueue.App, db_dsn: str) -> None:
    added = app.add_schedule(
        "s", "0 0 1 1 *", "report", {"n": 1}, queue="reports", priority=4, max_attempts=2
    )
    done = app.run_schedule_now("s")
    assert done.created
    job = app.get_job(done.job_id)
    assert (job.task, job.queue, job.payload, job.priority, job.max_attempts) == (
        "report",
        "reports",
        {"n": 1},
        4,
        2,
    )
    assert job.status == pgqueue.JobStatus.QUEUED
    after = app.get_schedule("s")
    assert after.last_job_id == done.job_id
    assert (after.next_fire_at, after.last_fire_at) == (added.next_fire_at, None)


def test_jobs_take_the_registered_tasks_defaults(app: pgqueue.App) -> None:
    @app.task(queue="mail", priority=7, max_attempts=9)
    def send() -> None: ...

    app.add_schedule("s", "0 0 1 1 *", "send")
    job = app.get_job(app.run_schedule_now("s").job_id)
    assert (job.queue, job.priority, job.max_attempts) == ("mail", 7, 9)


def test_async_twins(db_dsn: str) -> None:
    async def main() -> None:
        async with pgqueue.App(dsn=db_dsn) as app:
            added = await app.add_schedule_async("s", "* * * * * *", "t", {"a": 1})
            assert await app.list_schedules_async() == [added]
            assert await app.get_schedule_async("s") == added
            assert (await app.disable_schedule_async("s")).enabled is False
            assert (await app.enable_schedule_async("s")).enabled is True
            job = await app.run_schedule_now_async("s")
            assert (await app.get_job_async(job.job_id)).payload == {"a": 1}
            await app.remove_schedule_async("s")
            with pytest.raises(pgqueue.ScheduleNotFound):
                await app.remove_schedule_async("s")
            await app.add_schedule_async("t", "* * * * *", "t")
            with pytest.raises(pgqueue.DuplicateSchedule):
                await app.add_schedule_async("t", "* * * * *", "t", replace=False)

    asyncio.run(main())


def test_schema_not_migrated_is_a_clear_error(db_dsn: str) -> None:
    with (
        pgqueue.App(dsn=db_dsn, schema="elsewhere") as other,
        pytest.raises(pgqueue.SchemaNotMigrated, match="not migrated"),
    ):
        other.list_schedules()


# --- @app.periodic ---------------------------------------------------------------------


def test_periodic_registers_when_asked(db_dsn: str) -> None:
    with pgqueue.App(dsn=db_dsn) as app:

        @app.periodic(cron="*/10 * * * *", timezone="Europe/Berlin")
        @app.task(queue="reports")
        def report() -> None: ...

        @app.periodic(cron="0 * * * *", name="hourly-cleanup", payload={"deep": True})
        @app.task
        def cleanup(deep: bool) -> None: ...

        assert report.name == "report"  # the decorator returns the task itself
        registered = app._database.run(
            schedules.register_periodic(app.op_context, app.periodic_schedules)
        )
        assert [s.name for s in registered] == ["report", "hourly-cleanup"]
        by_name = {s.name: s for s in app.list_schedules()}
        assert (by_name["report"].cron, by_name["report"].timezone) == (
            "*/10 * * * *",
            "Europe/Berlin",
        )
        assert (by_name["hourly-cleanup"].task, by_name["hourly-cleanup"].payload) == (
            "cleanup",
            {"deep": True},
        )
        job = app.get_job(app.run_schedule_now("report").job_id)
        assert job.queue == "reports"


def test_periodic_rejects_bad_declarations_at_import() -> None:
    app = pgqueue.App(dsn="postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(pgqueue.InvalidCron):

        @app.periodic(cron="every day")
        @app.task
        def a() -> None: ...

    with pytest.raises(pgqueue.InvalidTimezone):

        @app.periodic(cron="* * * * *", timezone="Nowhere/Land")
        @app.task
        def b() -> None: ...

    with pytest.raises(pgqueue.InvalidOption, match=r"above @app\.task"):

        @app.periodic(cron="* * * * *")  # type: ignore[type-var]
        def c() -> None: ...

    @app.periodic(cron="* * * * *", name="same")
    @app.task
    def d() -> None: ...

    with pytest.raises(pgqueue.InvalidName, match="already declared"):

        @app.periodic(cron="* * * * *", name="same")
        @app.task
        def e() -> None: ...

    assert [s.name for s in app.periodic_schedules] == ["same"]


def test_schedule_is_a_public_frozen_dataclass() -> None:
    assert "Schedule" in pgqueue.__all__
    fields = set(pgqueue.Schedule.__dataclass_fields__)
    assert {"name", "cron", "timezone", "task", "queue", "payload", "priority"} <= fields
    assert {"max_attempts", "enabled", "next_fire_at", "last_fire_at", "last_job_id"} <= fields


def test_a_schedule_outlives_many_slots_in_a_frozen_hour(frozen: pgqueue.App, clock: Clock) -> None:
    clock.now = datetime(2030, 6, 1, tzinfo=UTC)
    frozen.add_schedule("s", "*/15 * * * *", "t")
    clock.now += timedelta(hours=1, minutes=1)
    tick = frozen._database.run(schedules.fire_due(frozen.op_context, None))
    assert [f.fire_times for f in tick.fired] == [[datetime(2030, 6, 1, 1, 0, tzinfo=UTC)]]


def test_periodic_registration_keeps_an_operators_disable_and_missed_slots(
    frozen: pgqueue.App, clock: Clock
) -> None:
    @frozen.periodic(cron="0 * * * *", name="hourly")
    @frozen.task
    def hourly() -> None: ...

    def register() -> pgqueue.Schedule:
        (done,) = frozen._database.run(
            schedules.register_periodic(frozen.op_context, frozen.periodic_schedules)
        )
        return done

    clock.now = datetime(2030, 1, 1, 9, 30, tzinfo=UTC)
    first = register()
    assert (first.enabled, first.next_fire_at) == (True, datetime(2030, 1, 1, 10, tzinfo=UTC))
    clock.now = datetime(2030, 1, 1, 13, 30, tzinfo=UTC)  # a deploy after a long outage
    assert register() == first  # the 10:00 slot is still owed (it fires once)
    frozen.disable_schedule("hourly")
    again = register()
    assert (again.enabled, again.next_fire_at) == (False, None)
