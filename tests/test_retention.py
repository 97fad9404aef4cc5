"""Retention: finished jobs leave by themselves.

Finished jobs move, once, to their status's partition, whose time-range
leaves a maintenance pass creates ahead and drops once retention has passed
them (sql/schema.sql, pgqueue/ops/retention.py). These tests drive passes
with the App's clock moved ahead (the database's trusted clock for the
schema's owner), so that nothing waits for real time; the election between
real worker processes is in tests/test_retention_election.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.ops import retention
from tests.cli_support import run_cli
from tests.fixtures.factory import JobFactory


def value(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def leaves(dsn: str, status: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = %s::regclass ORDER BY 1",
                (f"pgqueue.jobs_{status}",),
            )
        ]


def widths(dsn: str, status: str) -> set[timedelta]:
    """The time ranges of the status's leaves (the default leaf has none)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        bounds = conn.execute(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            (f"pgqueue.jobs_{status}",),
        ).fetchall()
    found = set()
    for (bound,) in bounds:
        if bound == "DEFAULT":
            continue
        low, high = (datetime.fromisoformat(t) for t in bound.split("'")[1::2])
        found.add(high - low)
    return found


def partition_of(dsn: str, job_id: int) -> str | None:
    return value(dsn, "SELECT tableoid::regclass::text FROM pgqueue.jobs WHERE id = %s", (job_id,))


@pytest.fixture
def later(db_dsn: str) -> Iterator[Any]:
    """An App on the same database whose clock is ``shift`` ahead."""
    apps: list[pgqueue.App] = []

    def make(shift: timedelta) -> pgqueue.App:
        ahead = pgqueue.App(db_dsn, clock=lambda: datetime.now(UTC) + shift)
        apps.append(ahead)
        return ahead

    yield make
    for made in apps:
        made.close()


def run_pass(app: pgqueue.App) -> pgqueue.RetentionPass:
    return app._database.run(retention.run_pass(app.op_context))


# --- the settings -------------------------------------------------------------------


def test_defaults_and_partial_changes(app: pgqueue.App) -> None:
    kept = app.get_retention()
    assert (kept.succeeded, kept.cancelled, kept.dead) == (
        timedelta(days=1),
        timedelta(days=7),
        timedelta(days=30),
    )
    changed = app.set_retention(succeeded="6h", dead=timedelta(days=90))
    assert (changed.succeeded, changed.cancelled, changed.dead) == (
        timedelta(hours=6),
        timedelta(days=7),
        timedelta(days=90),
    )
    assert app.get_retention() == changed


@pytest.mark.parametrize(
    "bad",
    [{"succeeded": "-1h"}, {"dead": "soon"}, {"cancelled": timedelta(days=40000)}, {"dead": -5}],
)
def test_bad_retention_is_refused_and_changes_nothing(
    app: pgqueue.App, bad: dict[str, Any]
) -> None:
    before = app.get_retention()
    with pytest.raises(pgqueue.InvalidDuration, match="retention of"):
        app.set_retention(**bad)
    assert app.get_retention() == before


def test_cli_shows_and_sets_retention(db_dsn: str) -> None:
    shown = run_cli(db_dsn, "retention", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {
        "succeeded": 86400.0,
        "cancelled": 604800.0,
        "dead": 2592000.0,
    }
    changed = run_cli(db_dsn, "retention", "--succeeded", "1m", "--dead", "0s", "--json")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout) == {"succeeded": 60.0, "cancelled": 604800.0, "dead": 0.0}
    table = run_cli(db_dsn, "retention")
    assert "succeeded" in table.stdout
    assert "1m" in table.stdout
    refused = run_cli(db_dsn, "retention", "--succeeded", "10")
    assert refused.returncode != 0
    assert "--succeeded" in refused.stderr
    assert json.loads(run_cli(db_dsn, "retention", "--json").stdout)["succeeded"] == 60.0


# --- where finished jobs go ---------------------------------------------------------


def test_a_finished_job_moves_once_to_its_status_partition(app: pgqueue.App, db_dsn: str) -> None:
    run_pass(app)  # creates the leaves of the coming finish times
    ok, failing = (app.enqueue("t").job_id for _ in range(2))
    assert partition_of(db_dsn, ok) == "pgqueue.jobs_live"
    leased = {j.job_id: j for j in app.lease(None, "w1", max=2)}
    app.ack(leased[ok], result={"n": 1})
    app.fail(leased[failing], "boom", permanent=True)
    assert partition_of(db_dsn, ok).startswith("pgqueue.jobs_succeeded_2")
    assert partition_of(db_dsn, failing).startswith("pgqueue.jobs_dead_2")
    # Every reader still sees them as before.
    assert app.get_job(ok).status == pgqueue.JobStatus.SUCCEEDED
    assert app.result(ok) == {"n": 1}
    assert app.get_job(failing, history=True).attempt_history[-1].error_message == "boom"
    listed = {j.id for j in app.list_jobs(status="succeeded")}
    assert ok in listed


def test_a_pass_creates_leaves_ahead_and_drops_those_past_retention(
    app: pgqueue.App, db_dsn: str, later: Any
) -> None:
    # The migration made the leaves of the default retention (a day: six
    # hours wide); a shorter one replaces those still empty at once.
    assert len(leaves(db_dsn, "succeeded")) == 4  # three leaves and the default
    assert widths(db_dsn, "succeeded") == {timedelta(hours=6)}
    app.set_retention(succeeded="1h")
    assert len(leaves(db_dsn, "succeeded")) == 4
    # (Compared by range, not name: a leaf is named by its start, and near a
    # six-hour boundary a narrow leaf starts where a wide one did.)
    assert widths(db_dsn, "succeeded") == {timedelta(minutes=15)}
    assert run_pass(app).leaves_created == 0  # nothing new is due yet
    job = app.enqueue("t").job_id
    [leased] = app.lease(None, "w1")
    app.ack(leased)
    assert run_pass(app).leaves_created == 0  # nothing new is due yet

    # Two hours on: the leaf holding the job is past its retention.
    ahead = later(timedelta(hours=2))
    done = run_pass(ahead)
    assert done.leaves_dropped >= 1
    with pytest.raises(pgqueue.JobNotFound):
        app.get_job(job)
    assert partition_of(db_dsn, job) is None


def test_a_dropped_leaf_takes_its_jobs_records_along(
    app: pgqueue.App, db_dsn: str, later: Any
) -> None:
    app.set_retention(succeeded="1h", cancelled="1h")
    run_pass(app)
    retried = app.enqueue("t", max_attempts=3).job_id
    [leased] = app.lease(None, "w1")
    app.fail(leased, "first try", retry_at=datetime.now(UTC) - timedelta(seconds=1))
    [leased] = app.lease(None, "w1")
    app.ack(leased)
    wf = app.workflow("kept-then-gone")
    first = wf.add("a")
    wf.add("b", after=first)
    run = wf.enqueue()
    for _ in range(2):
        [step] = app.lease(None, "w1")
        app.ack(step)
    assert (
        value(db_dsn, "SELECT count(*) FROM pgqueue.job_attempts WHERE job_id = %s", (retried,))
        == 1
    )
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.workflows") == 1

    run_pass(later(timedelta(hours=2)))
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.job_attempts") == 0
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.job_waits") == 0
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.job_dependencies") == 0
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.workflows") == 0
    with pytest.raises(pgqueue.WorkflowNotFound):
        app.get_workflow(run.workflow_id)


def test_each_status_keeps_its_own_retention(app: pgqueue.App, db_dsn: str, later: Any) -> None:
    app.set_retention(succeeded="1h", cancelled="1h", dead="30d")
    run_pass(app)
    ok, bad = (app.enqueue("t").job_id for _ in range(2))
    leased = {j.job_id: j for j in app.lease(None, "w1", max=2)}
    app.ack(leased[ok])
    app.fail(leased[bad], "no", permanent=True)
    run_pass(later(timedelta(hours=3)))
    with pytest.raises(pgqueue.JobNotFound):
        app.get_job(ok)
    assert app.get_job(bad).status == pgqueue.JobStatus.DEAD


def test_a_missing_leaf_is_made_again(app: pgqueue.App, db_dsn: str) -> None:
    """A gap between leaves (a creation skipped on a lock, a leaf dropped by
    hand) is filled by the next pass, not left to the default leaf."""
    app.set_retention(succeeded="1h")
    made = leaves(db_dsn, "succeeded")
    middle = sorted(made)[1]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE pgqueue.{middle}")
    assert run_pass(app).leaves_created == 1
    assert leaves(db_dsn, "succeeded") == made


def test_a_shorter_retention_applies_to_the_leaf_already_in_use(
    app: pgqueue.App, db_dsn: str, later: Any
) -> None:
    """Jobs already in a leaf made for the default day (six hours wide) leave
    by the new, shorter retention: one by one, until the leaf can go."""
    job = app.enqueue("t").job_id
    [leased] = app.lease(None, "w1")
    app.ack(leased)
    wide = partition_of(db_dsn, job)
    app.set_retention(succeeded="1h")
    assert partition_of(db_dsn, job) == wide  # a leaf holding jobs stays
    assert app.get_job(job).status == pgqueue.JobStatus.SUCCEEDED
    assert run_pass(later(timedelta(minutes=30))).jobs == 0
    done = run_pass(later(timedelta(minutes=90)))
    assert done.jobs == 1
    with pytest.raises(pgqueue.JobNotFound):
        app.get_job(job)


def test_rows_finished_while_no_worker_made_leaves_go_one_by_one(
    app: pgqueue.App, db_dsn: str, job_factory: JobFactory
) -> None:
    old = job_factory.insert(status="succeeded", finished_at=-3 * 86400.0)
    recent = job_factory.insert(status="succeeded", finished_at=-60.0)
    old_dead = job_factory.insert(status="dead", finished_at=-3 * 86400.0)
    assert partition_of(db_dsn, old) == "pgqueue.jobs_succeeded_default"
    done = run_pass(app)
    assert done.jobs == 1
    with pytest.raises(pgqueue.JobNotFound):
        app.get_job(old)
    assert app.get_job(recent).status == pgqueue.JobStatus.SUCCEEDED
    assert app.get_job(old_dead).status == pgqueue.JobStatus.DEAD  # kept 30 days


def test_a_leaf_starts_after_rows_a_default_leaf_holds_in_its_range(
    app: pgqueue.App, db_dsn: str
) -> None:
    """A finish time no leaf covered went to the default leaf; the leaf made
    afterwards starts after it, so that creating it cannot fail."""
    app.set_retention(succeeded="1h")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for leaf in leaves(db_dsn, "succeeded"):
            if leaf != "jobs_succeeded_default":
                conn.execute(f"DROP TABLE pgqueue.{leaf}")
    job = app.enqueue("t").job_id
    [leased] = app.lease(None, "w1")
    app.ack(leased)
    assert partition_of(db_dsn, job) == "pgqueue.jobs_succeeded_default"
    assert run_pass(app).leaves_created == 3
    assert partition_of(db_dsn, job) == "pgqueue.jobs_succeeded_default"
    second = app.enqueue("t").job_id
    [leased] = app.lease(None, "w1")
    app.ack(leased)
    assert partition_of(db_dsn, second).startswith("pgqueue.jobs_succeeded_2")


def test_zero_retention_deletes_a_job_when_it_ends_and_its_dependents_still_run(
    app: pgqueue.App, db_dsn: str
) -> None:
    app.set_retention(succeeded="0s")
    wf = app.workflow("forget")
    first = wf.add("a")
    second = wf.add("b", after=first)
    run = wf.enqueue()
    [step] = app.lease(None, "w1")
    app.ack(step, result=1)
    with pytest.raises(pgqueue.JobNotFound):
        app.get_job(run.jobs[first.name])
    [released] = app.lease(None, "w1")  # released when its dependency succeeded
    assert released.job_id == run.jobs[second.name]
    app.set_retention(succeeded="1d")
    app.ack(released)
    assert app.get_job(released.job_id).status == pgqueue.JobStatus.SUCCEEDED
    assert value(db_dsn, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'jobs_%%_forget'") == 0


def test_prune_drops_leaves_past_its_cutoff_and_counts_them(
    app: pgqueue.App, db_dsn: str, later: Any
) -> None:
    app.set_retention(succeeded="30d")
    run_pass(app)
    ids = [r.job_id for r in app.enqueue_many([pgqueue.JobSpec("t")] * 5)]
    for job in app.lease(None, "w1", max=5):
        app.ack(job)
    kept = run_pass(later(timedelta(hours=1)))
    assert kept.jobs == 0  # 30 days of retention
    ahead = later(timedelta(days=2))
    pruned = ahead.prune("1d")
    assert pruned["archived_jobs"] == 5
    for job_id in ids:
        with pytest.raises(pgqueue.JobNotFound):
            app.get_job(job_id)


def test_doctor_says_whether_workers_apply_retention(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    def finding(name: str) -> pgqueue.Finding:
        return next(f for f in app.doctor() if f.check == name)

    assert finding("maintenance").severity == "ok"  # nothing finished yet
    job_factory.insert(status="succeeded", finished_at=-3 * 86400.0)
    assert finding("maintenance").severity == "warn"
    assert "prune" in finding("maintenance").fix
    app._database.run(retention.claim("w1", 45.0))
    run_pass(app)
    app._database.run(retention.done("w1"))
    assert finding("maintenance").severity == "ok"
