"""Uniqueness over time: dedup_window and debounce, in Python, SQL and under
concurrent producers (real processes)."""

from __future__ import annotations

import json
import multiprocessing
import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgqueue
from pgqueue.errors import InvalidDuration, InvalidInput, InvalidOption
from tests.fixtures.dbstate import row_counts
from tests.test_security_grants import Roles


def _job(dsn: str, job_id: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        row = cur.execute(
            "SELECT id, status::text, payload, run_at, now() AS now, created_at, dedup_key"
            " FROM pgqueue.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
    assert row is not None
    return dict(row)


def _finish(dsn: str, job_id: int, *, created_ago: float = 0) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET status = 'succeeded', finished_at = now(),"
            " created_at = now() - make_interval(secs => %s) WHERE id = %s",
            (created_ago, job_id),
        )


def test_window_returns_the_job_created_within_it_even_when_finished(
    app: pgqueue.App, db_dsn: str
) -> None:
    first = app.enqueue("t", {"n": 1}, dedup_key="k", dedup_window=60)
    assert first.created
    again = app.enqueue("t", {"n": 2}, dedup_key="k", dedup_window=60)
    assert again == pgqueue.Enqueued(first.job_id, False)
    _finish(db_dsn, first.job_id, created_ago=30)
    # Finished 30 s ago, created within the 60 s window: still a hit.
    assert app.enqueue("t", {}, dedup_key="k", dedup_window=timedelta(minutes=1)) == (
        first.job_id,
        False,
    )
    # A 10 s window no longer covers it: a new job.
    fresh = app.enqueue("t", {}, dedup_key="k", dedup_window=10)
    assert fresh.created
    assert fresh.job_id != first.job_id
    # Other queues and keys are independent.
    assert app.enqueue("t", {}, queue="other", dedup_key="k", dedup_window=60).created
    assert app.enqueue("t", {}, dedup_key="k2", dedup_window=60).created


def test_window_sees_archived_jobs(app: pgqueue.App, db_dsn: str) -> None:
    first = app.enqueue("t", {}, dedup_key="arch", dedup_window=3600)
    _finish(db_dsn, first.job_id, created_ago=60)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET finished_at = now() - interval '1 day'")
    assert app.archive(older_than=3600) == 1
    assert app.enqueue("t", {}, dedup_key="arch", dedup_window=3600) == (first.job_id, False)


def test_live_job_older_than_the_window_gives_its_key_up(app: pgqueue.App, db_dsn: str) -> None:
    """At most one job per key *created within the window*, finished or not:
    a live job from before the window no longer holds the key (a far-future
    job cannot squat it for ever), but still dedups plain enqueues until then."""
    first = app.enqueue("t", {}, dedup_key="live")
    assert app.enqueue("t", {}, dedup_key="live", dedup_window=5) == (first.job_id, False)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.jobs SET created_at = now() - interval '1 hour'")
    fresh = app.enqueue("t", {}, dedup_key="live", dedup_window=5)
    assert fresh.created
    assert app.enqueue("t", {}, dedup_key="live") == (fresh.job_id, False)
    old = _job(db_dsn, first.job_id)
    assert (old["status"], old["dedup_key"]) == ("queued", None)


# The window is (now() - window, now()]: a job created exactly one window ago
# is outside it. Each case runs in one transaction, so now() is one instant
# for the setup and the enqueue; every place a windowed lookup reads.
BOUNDARY = {
    "inside": ("- interval '60 s' + interval '1 microsecond'", True),
    "at": ("- interval '60 s'", False),
    "past": ("- interval '60 s' - interval '1 microsecond'", False),
}


@pytest.mark.parametrize("place", ["live", "finished", "archived"])
def test_the_window_boundary_to_the_microsecond(app: pgqueue.App, db_dsn: str, place: str) -> None:
    earlier = {case: app.enqueue("t", {}, dedup_key=f"b-{case}").job_id for case in BOUNDARY}
    if place != "live":
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE pgqueue.jobs SET status = 'succeeded', finished_at = now()"
                " WHERE id = ANY(%s)",
                (list(earlier.values()),),
            )
    if place == "archived":
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE pgqueue.jobs SET finished_at = now() - interval '1 day' WHERE id = ANY(%s)",
                (list(earlier.values()),),
            )
        assert app.archive(older_than=3600) == len(BOUNDARY)
    table = sql.Identifier("pgqueue", "jobs_archive" if place == "archived" else "jobs")
    with psycopg.connect(db_dsn) as caller:
        for case, (offset, hit) in BOUNDARY.items():
            caller.execute(
                sql.SQL("UPDATE {} SET created_at = now() {} WHERE id = %s").format(
                    table,
                    sql.SQL(offset),  # type: ignore[arg-type]
                ),
                (earlier[case],),
            )
            got = app.enqueue("t", {}, dedup_key=f"b-{case}", dedup_window=60, conn=caller)
            assert (got.job_id == earlier[case], got.created) == (hit, not hit), case
        released = dict(
            caller.execute(
                "SELECT id, dedup_key FROM pgqueue.jobs_live WHERE id = ANY(%s)",
                (list(earlier.values()),),
            ).fetchall()
        )
        caller.commit()
    if place == "live":
        # A live job created before the window gives its key up; within it, keeps it.
        assert released == {
            earlier["inside"]: "b-inside",
            earlier["at"]: None,
            earlier["past"]: None,
        }


def test_debounce_replaces_payload_and_postpones(app: pgqueue.App, db_dsn: str) -> None:
    first = app.enqueue("t", {"v": 1}, dedup_key="d", debounce=30)
    assert first.created
    job = _job(db_dsn, first.job_id)
    assert job["status"] == "scheduled"
    assert timedelta(seconds=29) < job["run_at"] - job["now"] <= timedelta(seconds=30)
    second = app.enqueue("t", {"v": 2}, dedup_key="d", debounce=120)
    assert second == (first.job_id, False)
    job = _job(db_dsn, first.job_id)
    assert job["payload"] == {"v": 2}
    assert timedelta(seconds=119) < job["run_at"] - job["now"] <= timedelta(seconds=120)
    # debounce=0: the latest payload wins and the job is ready now.
    assert app.enqueue("t", {"v": 3}, dedup_key="d", debounce=0) == (first.job_id, False)
    job = _job(db_dsn, first.job_id)
    assert job["status"] == "queued"
    assert job["payload"] == {"v": 3}
    assert row_counts(db_dsn)["jobs"] == 1


def test_debounce_creates_a_new_job_once_the_earlier_finished(
    app: pgqueue.App, db_dsn: str
) -> None:
    first = app.enqueue("t", {"v": 1}, dedup_key="d", debounce=5)
    _finish(db_dsn, first.job_id)
    second = app.enqueue("t", {"v": 2}, dedup_key="d", debounce=5)
    assert second.created
    assert second.job_id != first.job_id


def test_debounce_keeps_a_running_job_running(app: pgqueue.App, db_dsn: str) -> None:
    first = app.enqueue("t", {"v": 1}, dedup_key="d", debounce=0)
    [leased] = app.lease("default", "w1")
    assert leased.job_id == first.job_id
    # One live job per key: the running one is returned, untouched.
    assert app.enqueue("t", {"v": 2}, dedup_key="d", debounce=0) == (first.job_id, False)
    assert _job(db_dsn, first.job_id)["payload"] == {"v": 1}


def test_with_options_jobspec_and_async(app: pgqueue.App, db_dsn: str) -> None:
    task = app.task(name="mail")(lambda **_: None)
    first = task.with_options(dedup_key="m", dedup_window=60).enqueue(to="a")
    assert task.with_options(dedup_key="m", dedup_window=60).enqueue(to="b") == (
        first.job_id,
        False,
    )
    results = app.enqueue_many(
        [
            pgqueue.JobSpec("mail", {"i": 1}),
            pgqueue.JobSpec("mail", {"i": 2}, dedup_key="m", dedup_window=60),
            pgqueue.JobSpec("mail", {"i": 3}, dedup_key="n", debounce=10),
            pgqueue.JobSpec("mail", {"i": 4}, dedup_key="n", debounce=10),
            pgqueue.JobSpec("mail", {"i": 5}),
        ]
    )
    assert [r.created for r in results] == [True, False, True, False, True]
    assert results[1].job_id == first.job_id
    assert results[2].job_id == results[3].job_id
    assert _job(db_dsn, results[3].job_id)["payload"] == {"i": 4}
    assert results[0].job_id != results[4].job_id
    # A key new to the database, twice in one batch: one job.
    pair = app.enqueue_many(
        [
            pgqueue.JobSpec("mail", {"i": 6}, dedup_key="fresh", dedup_window=60),
            pgqueue.JobSpec("mail", {"i": 7}, dedup_key="fresh", dedup_window=60),
        ]
    )
    assert [r.created for r in pair] == [True, False]
    assert pair[0].job_id == pair[1].job_id

    import asyncio

    async def enqueue_async() -> pgqueue.Enqueued:
        try:
            return await app.enqueue_async("mail", {}, dedup_key="m", dedup_window=60)
        finally:
            await app.close_async()

    assert asyncio.run(enqueue_async()) == (first.job_id, False)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"dedup_window": 10}, InvalidOption, "need a dedup_key"),
        ({"debounce": 10}, InvalidOption, "need a dedup_key"),
        ({"dedup_key": "k", "dedup_window": 10, "debounce": 1}, InvalidOption, "not both"),
        ({"dedup_key": "k", "dedup_window": 0}, InvalidDuration, "dedup_window must be > 0"),
        ({"dedup_key": "k", "dedup_window": -1}, InvalidDuration, "dedup_window"),
        ({"dedup_key": "k", "debounce": -1}, InvalidDuration, "debounce must be >= 0"),
        ({"dedup_key": "k", "debounce": 1, "delay": 5}, InvalidOption, "no run_at or delay"),
        ({"dedup_key": "k", "dedup_window": "soon"}, InvalidDuration, "not a duration"),
        ({"dedup_key": "k", "dedup_window": [1]}, InvalidDuration, "number of seconds"),
    ],
)
def test_nonsense_is_refused_and_writes_nothing(
    app: pgqueue.App, db_dsn: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        app.enqueue("t", {}, **options)
    assert row_counts(db_dsn)["jobs"] == 0


def test_sql_api(app: pgqueue.App, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:

        def enqueue(sql: str, *args: Any) -> int:
            row = conn.execute(sql, args).fetchone()
            assert row is not None
            return int(row[0])

        a = enqueue(
            "SELECT pgqueue.enqueue('t', '{}', dedup_key => 'w', dedup_window => interval '1 h')"
        )
        b = enqueue("SELECT pgqueue.enqueue('t', dedup_key => 'w', dedup_window => '1 h')")
        assert a == b
        # The 0001 signature still works, positionally and by name.
        c = enqueue("SELECT pgqueue.enqueue('t', '{}', 'default', 0, now(), NULL, 'w2')")
        assert c != a
        d = enqueue(
            "SELECT pgqueue.enqueue('t', '{\"v\": 1}', dedup_key => 'deb', debounce => '30 s')"
        )
        e = enqueue(
            "SELECT pgqueue.enqueue('t', '{\"v\": 2}', dedup_key => 'deb', debounce => '60 s')"
        )
        assert d == e
        assert _job(db_dsn, d)["payload"] == {"v": 2}
        for bad, text in [
            ("dedup_window => '1 h'", "need a dedup_key"),
            ("dedup_key => 'x', dedup_window => '-1 s'", "dedup_window must be positive"),
            ("dedup_key => 'x', debounce => '-1 s'", "debounce must not be negative"),
            ("dedup_key => 'x', debounce => '1 s', dedup_window => '1 h'", "not both"),
        ]:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=text):
                conn.execute(f"SELECT pgqueue.enqueue('t', {bad})")
    with pytest.raises(InvalidInput, match="not both"):
        # The same check in SQL, reached by a document that skipped Python's.
        app._database.run(
            _raw_windowed('[{"task": "t", "dedup_key": "k", "dedup_window": 1, "debounce": 1}]')
        )


def _raw_windowed(doc: str) -> Any:
    from pgqueue.ops import Execute

    rows = yield Execute("job_enqueue_windowed", {"jobs": doc})
    return rows


def test_lookups_use_indexes(app: pgqueue.App, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT id FROM pgqueue.jobs WHERE queue = 'q' AND dedup_key = 'k'"
                " AND created_at > now() - interval '1 h' ORDER BY created_at DESC LIMIT 1"
            )
        )
        assert "jobs_dedup_created_idx" in plan
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN UPDATE pgqueue.jobs SET payload = '{}' WHERE queue = 'q'"
                " AND dedup_key = 'k' AND status IN ('queued', 'scheduled')"
            )
        )
        assert "jobs_dedup_key_idx" in plan or "jobs_dedup_created_idx" in plan


# --- concurrent producers (real processes) -------------------------------------

PRODUCERS = 6
ROUNDS = 15
BATCHES = 4
BATCH_KEYS = 250


def _produce(dsn: str, mode: str, start: Any, index: int) -> list[tuple[int, bool]]:
    out = []
    with pgqueue.App(dsn=dsn, pool_min_size=0, pool_max_size=1) as app:
        start.wait()
        if mode == "batch":
            # Every producer settles the same keys in one statement, in its own
            # order (locks taken in input order would deadlock), several times.
            rng = random.Random(index)
            for batch_no in range(BATCHES):
                order = list(range(BATCH_KEYS))
                rng.shuffle(order)
                specs = [
                    pgqueue.JobSpec(
                        "t", {"p": index}, dedup_key=f"key-{batch_no}-{r}", dedup_window=3600
                    )
                    for r in order
                ]
                by_key = dict(zip(order, app.enqueue_many(specs), strict=True))
                out += [(by_key[r].job_id, by_key[r].created) for r in range(BATCH_KEYS)]
            return out
        for round_no in range(ROUNDS):
            key = f"key-{round_no}"
            if mode == "window":
                r = app.enqueue("t", {"p": index}, dedup_key=key, dedup_window=3600)
            else:
                r = app.enqueue("t", {"p": index, "r": round_no}, dedup_key=key, debounce=60)
            out.append((r.job_id, r.created))
    return out


@pytest.mark.parametrize("mode", ["window", "debounce", "batch"])
def test_concurrent_producers_create_one_job_per_key(
    app: pgqueue.App, db_dsn: str, mode: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Manager().Event()
    with ctx.Pool(PRODUCERS) as pool:
        pending = [pool.apply_async(_produce, (db_dsn, mode, start, i)) for i in range(PRODUCERS)]
        start.set()
        results = [p.get(timeout=120) for p in pending]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        per_key = dict(
            conn.execute(
                "SELECT dedup_key, count(*) FROM pgqueue.jobs GROUP BY dedup_key"
            ).fetchall()
        )
    keys = (
        [f"key-{b}-{r}" for b in range(BATCHES) for r in range(BATCH_KEYS)]
        if mode == "batch"
        else [f"key-{r}" for r in range(ROUNDS)]
    )
    assert per_key == dict.fromkeys(keys, 1)
    created = [c for out in results for _, c in out]
    assert created.count(True) == len(keys)
    for n, key in enumerate(keys):
        ids = {out[n][0] for out in results}
        assert len(ids) == 1, f"producers got different ids for {key}: {ids}"


def test_repeatable_read_contention_is_a_serialization_failure(
    app: pgqueue.App, db_dsn: str
) -> None:
    holder = psycopg.connect(db_dsn)
    other = psycopg.connect(db_dsn)
    try:
        app.enqueue("t", {}, dedup_key="rr", dedup_window=60, conn=holder)  # holds the key's lock
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(pgqueue.errors.QueryFailed, match="retry this transaction") as err:
            app.enqueue("t", {}, dedup_key="rr", dedup_window=60, conn=other)
        assert err.value.sqlstate == "40001"
        assert err.value.transient
        other.rollback()
        holder.commit()
    finally:
        holder.close()
        other.close()
    assert row_counts(db_dsn)["jobs"] == 1


def test_cli_options(app: pgqueue.App, db_dsn: str) -> None:
    from tests.cli_support import invoke

    first = invoke(db_dsn, "enqueue", "t", "--dedup-key", "c", "--dedup-window", "1h", "--json")
    assert first.exit_code == 0, first.output
    again = invoke(db_dsn, "enqueue", "t", "--dedup-key", "c", "--dedup-window", "1h", "--json")
    assert json.loads(again.output) == {
        "job_id": json.loads(first.output)["job_id"],
        "created": False,
    }
    deb = invoke(
        db_dsn, "enqueue", "t", "--payload", '{"v": 1}', "--dedup-key", "d", "--debounce", "30s"
    )
    assert deb.exit_code == 0, deb.output
    bad = invoke(db_dsn, "enqueue", "t", "--dedup-window", "1h")
    assert bad.exit_code == 1
    assert "need a dedup_key" in bad.output
    bad = invoke(db_dsn, "enqueue", "t", "--dedup-key", "e", "--debounce", "soon")
    assert bad.exit_code == 1
    assert "--debounce" in bad.output
    assert row_counts(db_dsn)["jobs"] == 2


# --- privileges ------------------------------------------------------------------


@pytest.fixture
def db_roles(pg_server_dsn: str) -> Iterator[Roles]:
    made = Roles(pg_server_dsn)
    try:
        yield made
    finally:
        made.drop_all()


def test_a_producer_role_enqueues_windowed_and_debounced(db_dsn: str, db_roles: Roles) -> None:
    producer = db_roles.create(db_dsn, kind="producer")
    with pgqueue.App(dsn=producer.dsn) as as_producer:
        first = as_producer.enqueue("t", {}, dedup_key="p", dedup_window=60)
        assert as_producer.enqueue("t", {}, dedup_key="p", dedup_window=60) == (
            first.job_id,
            False,
        )
        assert as_producer.enqueue("t", {"v": 1}, dedup_key="q", debounce=5).created
    with psycopg.connect(producer.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pgqueue.enqueue('t', dedup_key => 'p', dedup_window => '1 min')"
        ).fetchone()
        assert row == (first.job_id,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pgqueue.dedup_claim('default', 'p', '1 min', NULL, '{}')")


@pytest.mark.parametrize("how", ["window", "debounce"])
def test_a_window_of_an_unknown_task_is_kept_in_the_registry_queue(
    app: pgqueue.App, db_dsn: str, how: str
) -> None:
    """The caller does not know the task: the job goes to the queue the task
    registry names, and its dedup window is looked up there, not in
    ``default``."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgqueue.tasks (name, queue) VALUES ('report.build', 'reports')")
    option: dict[str, Any] = {"dedup_window": 60} if how == "window" else {"debounce": 0}
    first = app.enqueue("report.build", {"n": 1}, dedup_key="k", **option)
    with psycopg.connect(db_dsn) as conn:
        where = conn.execute("SELECT queue FROM pgqueue.jobs WHERE id = %s", (first.job_id,))
        assert where.fetchone() == ("reports",)
    if how == "window":
        (leased,) = app.lease("reports", "w1")
        app.ack(leased)  # finished: only the window can find it now
    again = app.enqueue("report.build", {"n": 2}, dedup_key="k", **option)
    assert (again.job_id, again.created) == (first.job_id, False)
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.jobs WHERE dedup_key = 'k'").fetchone()
    assert row == (1,)
    if how == "debounce":
        assert _job(db_dsn, first.job_id)["payload"] == {"n": 2}
