"""Migrations: empty to head, head to head, down and up again, every earlier
revision to head, two schemas in one database, ``--sql``, the wheel install,
and the Python enums and revision constant against the database."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.script import ScriptDirectory

import pgqueue
from pgqueue.migrate import current, downgrade, upgrade
from pgqueue.version import SCHEMA_REVISION
from tests.fixtures.dbstate import schema_fingerprint, snapshot
from tests.fixtures.postgres import is_ci

REPO = Path(__file__).resolve().parent.parent
CORE_TABLES = {"jobs", "job_attempts", "jobs_archive", "queues", "workers"}


def revisions() -> list[str]:
    """Every revision of the checkout's migrations/, oldest first."""
    script = ScriptDirectory(str(REPO / "migrations"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def head_revision() -> str:
    heads = ScriptDirectory(str(REPO / "migrations")).get_heads()
    assert len(heads) == 1, f"migrations/ must have one head, has {heads}"
    return heads[0]


def tables(dsn: str, schema: str = "pgqueue") -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


def object_ids(dsn: str, schema: str = "pgqueue") -> list[tuple[Any, ...]]:
    """OIDs of every relation, function and type: a dropped and re-created object changes them."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            """
            SELECT 'rel', c.relname, c.oid::int8 FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s
            UNION ALL
            SELECT 'proc', p.proname, p.oid::int8 FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %(s)s
            UNION ALL
            SELECT 'type', t.typname, t.oid::int8 FROM pg_type t
            JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = %(s)s
            ORDER BY 1, 2, 3
            """,
            {"s": schema},
        ).fetchall()


@pytest.fixture(scope="session")
def head_fingerprint(pg_server_dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """The schema of a database migrated straight from empty to head."""
    from tests.fixtures.cluster import create_database, drop_database, unique_db_name

    name = unique_db_name("pgq_headfp")
    dsn = create_database(pg_server_dsn, name)
    try:
        upgrade(dsn)
        return schema_fingerprint(dsn)
    finally:
        drop_database(pg_server_dsn, name)


# --- revisions --------------------------------------------------------------------------


def test_schema_revision_is_the_alembic_head() -> None:
    assert head_revision() == SCHEMA_REVISION
    assert revisions()[-1] == SCHEMA_REVISION


def test_migrations_form_one_line_from_base() -> None:
    script = ScriptDirectory(str(REPO / "migrations"))
    chain = revisions()
    assert script.get_revision(chain[0]).down_revision is None
    for older, newer in itertools.pairwise(chain):
        assert script.get_revision(newer).down_revision == older


def test_python_enums_equal_the_database_enums(conn: psycopg.Connection[Any]) -> None:
    def labels(type_name: str) -> list[str]:
        row = conn.execute(
            f"SELECT enum_range(NULL::pgqueue.{type_name})::text[]"  # fixed names, not input
        ).fetchone()
        assert row is not None
        return list(row[0])

    assert labels("job_status") == [s.value for s in pgqueue.JobStatus]
    assert labels("attempt_outcome") == [o.value for o in pgqueue.AttemptOutcome]


# --- upgrade ----------------------------------------------------------------------------


def test_empty_database_to_head(
    empty_db_dsn: str, head_fingerprint: dict[str, list[tuple[Any, ...]]]
) -> None:
    assert current(empty_db_dsn) is None

    upgrade(empty_db_dsn)

    assert current(empty_db_dsn) == SCHEMA_REVISION
    assert tables(empty_db_dsn) >= CORE_TABLES
    fingerprint = schema_fingerprint(empty_db_dsn)
    functions = {f[0] for f in fingerprint["functions"]}
    assert {"enqueue", "lease_jobs"} <= functions
    assert "jobs_ready_idx" in {i[0] for i in fingerprint["indexes"]}
    assert fingerprint == head_fingerprint
    with pgqueue.App(dsn=empty_db_dsn) as app:
        job_id = app.enqueue("t").job_id
        assert [j.job_id for j in app.lease("default", "w1")] == [job_id]


def test_head_to_head_changes_nothing(app: pgqueue.App, db_dsn: str) -> None:
    app.enqueue("kept", {"a": 1})
    app.close()
    fingerprint, oids, data = schema_fingerprint(db_dsn), object_ids(db_dsn), snapshot(db_dsn)

    upgrade(db_dsn)
    pgqueue.App(dsn=db_dsn).migrate()

    assert schema_fingerprint(db_dsn) == fingerprint
    assert object_ids(db_dsn) == oids
    assert snapshot(db_dsn) == data
    assert current(db_dsn) == SCHEMA_REVISION


def test_downgrade_to_base_and_back_up(
    db_dsn: str, head_fingerprint: dict[str, list[tuple[Any, ...]]]
) -> None:
    downgrade(db_dsn, revision="base")

    assert current(db_dsn) is None
    fingerprint = schema_fingerprint(db_dsn)
    # Only Alembic's own version table (kept in the schema) may remain.
    assert {r[0] for r in fingerprint["relations"]} <= {"alembic_version", "alembic_version_pkc"}
    assert fingerprint["functions"] == []
    assert fingerprint["types"] == []
    assert fingerprint["sequences"] == []
    with (
        pgqueue.App(dsn=db_dsn) as app,
        pytest.raises(pgqueue.SchemaNotMigrated, match="pgqueue migrate"),
    ):
        app.enqueue("t")

    upgrade(db_dsn)

    assert current(db_dsn) == SCHEMA_REVISION
    assert schema_fingerprint(db_dsn) == head_fingerprint
    with pgqueue.App(dsn=db_dsn) as app:
        job_id = app.enqueue("t").job_id
        (leased,) = app.lease("default", "w1")
        app.ack(leased)
        assert app.get_job(job_id).status is pgqueue.JobStatus.SUCCEEDED


@pytest.mark.parametrize("revision", revisions())
def test_each_revision_upgrades_to_the_same_head(
    empty_db_dsn: str, head_fingerprint: dict[str, list[tuple[Any, ...]]], revision: str
) -> None:
    upgrade(empty_db_dsn, revision=revision)
    assert current(empty_db_dsn) == revision

    upgrade(empty_db_dsn)

    assert current(empty_db_dsn) == SCHEMA_REVISION
    assert schema_fingerprint(empty_db_dsn) == head_fingerprint


@pytest.mark.parametrize("revision", revisions()[:-1])
def test_downgrade_to_each_earlier_revision_and_back(
    db_dsn: str, head_fingerprint: dict[str, list[tuple[Any, ...]]], revision: str
) -> None:
    downgrade(db_dsn, revision=revision)
    assert current(db_dsn) == revision
    with (
        pgqueue.App(dsn=db_dsn) as app,
        pytest.raises(pgqueue.SchemaNotMigrated, match="pgqueue migrate"),
    ):
        app.enqueue("t")

    upgrade(db_dsn)

    assert schema_fingerprint(db_dsn) == head_fingerprint


def test_concurrent_migrations_of_one_database(
    empty_db_dsn: str, head_fingerprint: dict[str, list[tuple[Any, ...]]]
) -> None:
    # Four deploys starting at once, as separate processes (Alembic's proxies are
    # per process; the advisory lock serialises the processes).
    code = "import sys; from pgqueue.migrate import upgrade; upgrade(sys.argv[1])"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, empty_db_dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = []
    for process in processes:
        try:
            _, stderr = process.communicate(timeout=120)
        finally:
            process.kill()
        outcomes.append((process.returncode, stderr))

    assert [code for code, _ in outcomes] == [0, 0, 0, 0], outcomes
    assert current(empty_db_dsn) == SCHEMA_REVISION
    assert schema_fingerprint(empty_db_dsn) == head_fingerprint


# --- schemas ---------------------------------------------------------------------------------


def test_two_schemas_in_one_database_are_independent(
    empty_db_dsn: str, head_fingerprint: dict[str, list[tuple[Any, ...]]]
) -> None:
    upgrade(empty_db_dsn, schema="pgqueue")
    upgrade(empty_db_dsn, schema="other")
    assert current(empty_db_dsn, schema="other") == SCHEMA_REVISION
    assert tables(empty_db_dsn, "other") >= CORE_TABLES

    with (
        pgqueue.App(dsn=empty_db_dsn) as main,
        pgqueue.App(dsn=empty_db_dsn, schema="other") as other,
    ):
        mine = main.enqueue("t", {"app": "main"}, dedup_key="k")
        theirs = other.enqueue("t", {"app": "other"}, dedup_key="k")
        assert mine.created
        assert theirs.created  # dedup keys do not cross schemas
        (leased,) = other.lease("default", "w1", max=10)
        assert leased.payload == {"app": "other"}
        assert other.lease("default", "w1", max=10) == []
        assert main.get_job(mine.job_id).status is pgqueue.JobStatus.QUEUED

        main_data = snapshot(empty_db_dsn, "pgqueue")
        downgrade(empty_db_dsn, schema="other", revision="base")

        assert schema_fingerprint(empty_db_dsn, "pgqueue") == head_fingerprint
        assert snapshot(empty_db_dsn, "pgqueue") == main_data
        assert current(empty_db_dsn, schema="pgqueue") == SCHEMA_REVISION
        assert current(empty_db_dsn, schema="other") is None
        assert tables(empty_db_dsn, "other") <= {"alembic_version"}
        assert [j.job_id for j in main.lease("default", "w1")] == [mine.job_id]


def test_sql_api_lives_in_its_schema(empty_db_dsn: str) -> None:
    upgrade(empty_db_dsn, schema="other")
    with psycopg.connect(empty_db_dsn) as conn:
        row = conn.execute("SELECT other.enqueue('t', queue => 'q')").fetchone()
        assert row is not None
        conn.commit()
    with pgqueue.App(dsn=empty_db_dsn, schema="other") as other:
        assert other.get_job(row[0]).queue == "q"


# --- migrate --sql ------------------------------------------------------------------------------


def pgqueue_script() -> Path:
    """The ``pgqueue`` console script of the running interpreter's environment."""
    script = Path(sys.executable).parent / "pgqueue"
    assert script.exists(), f"no pgqueue script next to {sys.executable}"
    return script


def test_migrate_sql_prints_sql_and_writes_nothing(
    empty_db_dsn: str, head_fingerprint: dict[str, list[tuple[Any, ...]]]
) -> None:
    result = subprocess.run(
        [str(pgqueue_script()), "--dsn", empty_db_dsn, "migrate", "--sql"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "CREATE TABLE" in text
    assert "pgqueue.jobs" in text.replace('"', "")
    assert "FUNCTION" in text
    assert "alembic_version" in text
    assert SCHEMA_REVISION in text
    assert current(empty_db_dsn) is None
    assert tables(empty_db_dsn) == set()

    # A DBA running the printed SQL gets exactly the migrated schema.
    with psycopg.connect(empty_db_dsn, autocommit=True) as dba:
        dba.execute(text.encode())
    assert current(empty_db_dsn) == SCHEMA_REVISION
    assert schema_fingerprint(empty_db_dsn) == head_fingerprint


def test_migrate_sql_for_another_schema(empty_db_dsn: str) -> None:
    buffer = io.StringIO()
    text = upgrade(empty_db_dsn, schema="billing_jobs", sql=True, output=buffer)

    assert text is not None
    assert buffer.getvalue() == text
    assert "billing_jobs" in text
    assert "pgqueue.jobs" not in text.replace('"', "")
    assert current(empty_db_dsn, schema="billing_jobs") is None


# --- wheel install -------------------------------------------------------------------------


@pytest.fixture
def wheel_bin() -> Path:
    """The ``pgqueue`` script of a wheel installed in a fresh venv (set by .ci/run)."""
    value = os.environ.get("PGQUEUE_WHEEL_BIN", "").strip()
    if not value:
        if is_ci(os.environ):
            pytest.fail("CI=true but PGQUEUE_WHEEL_BIN is unset", pytrace=False)
        pytest.skip("PGQUEUE_WHEEL_BIN is unset (set by .ci/run)")
    path = Path(value)
    assert path.is_file(), f"PGQUEUE_WHEEL_BIN={value} does not exist"
    return path


def clean_env() -> dict[str, str]:
    """The environment without anything pointing back into the checkout."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PGQUEUE_DSN", "DATABASE_URL"}
    }


WHEEL_SMOKE = """
import sys, pgqueue
print(pgqueue.__file__)
with pgqueue.App(dsn=sys.argv[1]) as app:
    job = app.enqueue("smoke", {"n": 1})
    (leased,) = app.lease("default", "wheel-worker")
    app.ack(leased, result="ok")
    print(app.get_job(job.job_id).status.value)
"""


def test_wheel_installed_pgqueue_migrate(
    wheel_bin: Path, empty_db_dsn: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(wheel_bin), "--dsn", empty_db_dsn, "migrate"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert current(empty_db_dsn) == SCHEMA_REVISION
    assert tables(empty_db_dsn) >= CORE_TABLES

    # The installed library finds its SQL outside the checkout.
    python = wheel_bin.parent / "python"
    smoke = subprocess.run(
        [str(python), "-c", WHEEL_SMOKE, empty_db_dsn],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    module_path, status = smoke.stdout.split()
    assert not Path(module_path).resolve().is_relative_to(REPO)
    assert status == "succeeded"
