"""The archive range-partitioned by finish time (revision 0010).

Converting keeps every row and lets readers go on; archive creates the
partitions it needs; prune drops whole partitions and deletes only the rows
of the partition the cutoff falls in; the result equals what a plain archive
would hold.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

import pgqueue
from pgqueue.errors import InvalidOption
from tests.cli_support import rows, run_cli, value

pytestmark = pytest.mark.timeout(180)


def archive_rows(dsn: str, count: int, age: str) -> None:
    """``count`` archived jobs that finished ``age`` ago (spread over one minute)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.jobs_archive (id, task, queue, payload, status, attempts,"
            " run_at, finished_at)"
            " SELECT nextval('pgqueue.jobs_id_seq'), 'old_task', 'bulk', '{}', 'succeeded', 1,"
            " now() - %(age)s::interval, now() - %(age)s::interval + i * interval '1 ms'"
            " FROM generate_series(1, %(count)s) AS i",
            {"age": age, "count": count},
        )


def finished_jobs(dsn: str, count: int, age: str) -> None:
    """``count`` succeeded jobs still in the hot table, finished ``age`` ago."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.jobs (task, queue, payload, status, attempts, run_at,"
            " attempt_id, finished_at)"
            " SELECT 'new_task', 'bulk', jsonb_build_object('i', i), 'succeeded', 1,"
            " now() - %(age)s::interval, nextval('pgqueue.attempt_id_seq'),"
            " now() - %(age)s::interval + i * interval '1 ms'"
            " FROM generate_series(1, %(count)s) AS i",
            {"age": age, "count": count},
        )


def partitions(dsn: str) -> list[str]:
    return [
        r[0]
        for r in rows(
            dsn,
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'pgqueue.jobs_archive'::regclass ORDER BY 1",
        )
    ]


@pytest.fixture
def partitioned(app: pgqueue.App, db_dsn: str) -> pgqueue.App:
    archive_rows(db_dsn, 300, "40 days")
    layout = app.partition_archive("day")
    assert layout.partitioned
    return app


def test_plain_archive_reports_its_layout(app: pgqueue.App) -> None:
    layout = app.archive_layout()
    assert layout == pgqueue.ArchiveLayout(
        partitioned=False, period=None, partitions=0, legacy_upper=None
    )


def test_conversion_keeps_every_row_and_takes_the_name(app: pgqueue.App, db_dsn: str) -> None:
    archive_rows(db_dsn, 500, "3 days")
    before = rows(db_dsn, "SELECT id, finished_at FROM pgqueue.jobs_archive ORDER BY id")

    layout = app.partition_archive("week")

    assert layout.partitioned
    assert layout.period == "week"
    assert (
        value(
            db_dsn,
            "SELECT relkind::text FROM pg_class WHERE oid = 'pgqueue.jobs_archive'::regclass",
        )
        == "p"
    )
    after = rows(db_dsn, "SELECT id, finished_at FROM pgqueue.jobs_archive ORDER BY id")
    assert after == before
    names = partitions(db_dsn)
    assert "jobs_archive_legacy" in names
    # the legacy partition plus the periods ahead
    assert layout.partitions == len(names) >= 2
    # lookups by id still use an index on every partition
    plan = "\n".join(
        r[0] for r in rows(db_dsn, "EXPLAIN SELECT * FROM pgqueue.jobs_archive WHERE id = 1")
    )
    assert "Seq Scan" not in plan


def test_conversion_is_idempotent_and_refuses_another_period(partitioned: pgqueue.App) -> None:
    again = partitioned.partition_archive("day")
    assert again.partitioned
    assert again.period == "day"
    with pytest.raises(InvalidOption, match="already partitioned by day"):
        partitioned.partition_archive("month")
    with pytest.raises(InvalidOption, match="invalid partition period"):
        partitioned.partition_archive("fortnight")


def test_readers_go_on_during_the_conversion(app: pgqueue.App, db_dsn: str) -> None:
    archive_rows(db_dsn, 5000, "2 days")
    errors: list[BaseException] = []
    counts: list[int] = []
    stop = threading.Event()

    def read() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    row = conn.execute("SELECT count(*) FROM pgqueue.jobs_archive").fetchone()
                    counts.append(row[0] if row else -1)
                except psycopg.Error as error:  # pragma: no cover - the failure we test for
                    errors.append(error)
                    return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        app.partition_archive("day")
    finally:
        stop.set()
        reader.join(30)
    assert not errors
    assert counts
    assert set(counts) == {5000}


def test_archive_creates_partitions_and_rows_land_by_finish_time(
    partitioned: pgqueue.App, db_dsn: str
) -> None:
    finished_jobs(db_dsn, 200, "2 hours")
    moved = partitioned.archive("1h")
    assert moved == 200
    by_partition = dict(
        rows(
            db_dsn,
            "SELECT tableoid::regclass::text, count(*) FROM pgqueue.jobs_archive"
            " WHERE task = 'new_task' GROUP BY 1",
        )
    )
    # rows archived after the conversion still fall in the legacy partition's
    # range (it leaves slack), or in day partitions
    assert sum(by_partition.values()) == 200
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs WHERE task = 'new_task'") == 0


def test_prune_drops_whole_partitions_and_deletes_only_the_rest(
    partitioned: pgqueue.App, db_dsn: str
) -> None:
    # Rows in later day partitions: age them past the legacy bound by moving
    # the clock of the rows, not of the server.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        legacy_upper = conn.execute(
            "SELECT legacy_upper FROM pgqueue.archive_partitioning"
        ).fetchone()
        assert legacy_upper is not None
        upper = legacy_upper[0]
        # three days of rows after the legacy bound, 100 per day
        conn.execute(
            "SELECT pgqueue.archive_partitions_ensure(%(upper)s, %(upper)s + interval '3 days')",
            {"upper": upper},
        )
        conn.execute(
            "INSERT INTO pgqueue.jobs_archive (id, task, queue, payload, status, attempts,"
            " run_at, finished_at)"
            " SELECT nextval('pgqueue.jobs_id_seq'), 'day_task', 'bulk', '{}', 'succeeded', 1,"
            " %(upper)s, %(upper)s + d * interval '1 day' + i * interval '1 minute'"
            " FROM generate_series(0, 2) d, generate_series(1, 100) i",
            {"upper": upper},
        )
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 600
    before = set(partitions(db_dsn))

    # A cutoff in the middle of day 1 (the rows lie in the future: the legacy
    # partition's bound leaves slack), through an App whose clock is one day
    # past it.
    cutoff = upper + timedelta(days=1, minutes=50, seconds=30)
    with pgqueue.App(dsn=db_dsn, clock=lambda: cutoff + timedelta(days=1)) as later:
        assert later.prune_count("1d") == 450
        result = later.prune("1d")

    assert result["archived_jobs"] == 450
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 150
    gone = before - set(partitions(db_dsn))
    assert "jobs_archive_legacy" in gone  # the 300 converted rows, dropped whole
    assert len(gone) == 2  # legacy and day 0; day 1 was pruned row by row
    left = rows(db_dsn, "SELECT min(finished_at) FROM pgqueue.jobs_archive")[0][0]
    assert left >= cutoff
    layout = partitioned.archive_layout()
    assert layout.legacy_upper is None


def test_prune_limit_bounds_what_partitions_may_drop(partitioned: pgqueue.App, db_dsn: str) -> None:
    upper = partitioned.archive_layout().legacy_upper
    assert upper is not None
    with pgqueue.App(dsn=db_dsn, clock=lambda: upper + timedelta(days=2)) as later:
        result = later.prune("1d", limit=100)
        # the legacy partition holds 300 rows: too many to drop whole under
        # the limit, so 100 are deleted row by row
        assert result["archived_jobs"] == 100
        assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 200
        assert "jobs_archive_legacy" in partitions(db_dsn)
        assert later.prune("1d")["archived_jobs"] == 200
    assert "jobs_archive_legacy" not in partitions(db_dsn)
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 0


def test_prune_before_the_legacy_bound_deletes_rows(partitioned: pgqueue.App, db_dsn: str) -> None:
    # the legacy partition also holds rows newer than the cutoff: it stays
    assert partitioned.prune("1d")["archived_jobs"] == 300
    assert "jobs_archive_legacy" in partitions(db_dsn)


def test_get_job_reads_the_partitioned_archive(partitioned: pgqueue.App, db_dsn: str) -> None:
    job = partitioned.enqueue("t", {"x": 1})
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET status = 'succeeded', attempts = 1,"
            " finished_at = now() - interval '2 days' WHERE id = %s",
            (job.job_id,),
        )
    assert partitioned.archive("1d") == 1
    found = partitioned.get_job(job.job_id)
    assert found.status == "succeeded"
    assert found.payload == {"x": 1}


def test_cli_converts_and_reports(db_dsn: str) -> None:
    archive_rows(db_dsn, 10, "1 day")
    done = run_cli(db_dsn, "migrate", "--partitioned-archive", "--partition-period", "week")
    assert done.returncode == 0, done.stderr
    assert "the archive is now partitioned by week" in done.stdout
    again = run_cli(db_dsn, "migrate", "--partitioned-archive", "--partition-period", "week")
    assert again.returncode == 0, again.stderr
    assert "the archive is partitioned by week" in again.stdout
    assert value(db_dsn, "SELECT count(*) FROM pgqueue.jobs_archive") == 10

    refused = run_cli(db_dsn, "migrate", "--partitioned-archive", "--sql")
    assert refused.returncode != 0
    assert "no --sql form" in refused.stderr
    bad = run_cli(db_dsn, "migrate", "--partitioned-archive", "--partition-period", "hour")
    assert bad.returncode != 0
    assert "invalid partition period" in bad.stderr
