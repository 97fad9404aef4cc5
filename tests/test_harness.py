"""Tests of the test harness itself: isolation, CI strictness, the throwaway cluster."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.fixtures.cluster import ThrowawayCluster
from tests.fixtures.postgres import TEST_DSN_ENV, choose_server


@pytest.mark.parametrize("owner", ["first", "second"])
def test_each_test_gets_its_own_database(db_dsn: str, owner: str) -> None:
    # Whichever of the two runs second would hit an existing table or the other's row
    # if they shared a database, in any order and on any xdist worker.
    with psycopg.connect(db_dsn) as connection:
        connection.execute("CREATE TABLE harness_probe (owner text NOT NULL)")
        connection.execute("INSERT INTO harness_probe VALUES (%s)", (owner,))
    with psycopg.connect(db_dsn) as connection:
        rows = connection.execute("SELECT owner FROM harness_probe").fetchall()
    assert rows == [(owner,)]


def test_database_is_cloned_from_the_migrated_template(
    conn: psycopg.Connection[tuple[object, ...]], schema_name: str
) -> None:
    row = conn.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema_name,)
    ).fetchone()
    assert row == (1,)


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_no_server_under_ci_fails_instead_of_skipping(ci: str) -> None:
    with pytest.raises(pytest.fail.Exception, match="CI=true but no PostgreSQL"):
        choose_server(
            {"CI": ci},
            docker_answers=lambda: False,
            find_bindir=lambda: None,
            embedded_available=lambda: False,
        )


@pytest.mark.parametrize("env", [{}, {"CI": "false"}, {"CI": ""}])
def test_no_server_outside_ci_skips(env: dict[str, str]) -> None:
    with pytest.raises(pytest.skip.Exception):
        choose_server(
            env,
            docker_answers=lambda: False,
            find_bindir=lambda: None,
            embedded_available=lambda: False,
        )


def test_explicit_dsn_wins_over_docker_and_local_binaries() -> None:
    source = choose_server(
        {TEST_DSN_ENV: "postgresql://u@h/db", "CI": "true"},
        docker_answers=lambda: pytest.fail("docker must not be asked"),
        find_bindir=lambda: pytest.fail("binaries must not be looked for"),
    )
    assert (source.kind, source.dsn) == ("env", "postgresql://u@h/db")


def test_embedded_wheel_is_the_last_resort() -> None:
    source = choose_server(
        {"CI": "true"},
        docker_answers=lambda: False,
        find_bindir=lambda: None,
        embedded_available=lambda: True,
    )
    assert source.kind == "embedded"
    local = choose_server(
        {},
        docker_answers=lambda: False,
        find_bindir=lambda: Path("/x"),
        embedded_available=lambda: True,
    )
    assert local.kind == "local"


@pytest.mark.slow
def test_cluster_survives_restart_and_crash(cluster: ThrowawayCluster) -> None:
    dsn = cluster.create_database("probe")
    with psycopg.connect(dsn) as connection:
        connection.execute("CREATE TABLE kept (n int)")
        connection.execute("INSERT INTO kept VALUES (1)")
    survivor = psycopg.connect(dsn, autocommit=True)
    port = cluster.port

    cluster.restart()

    with pytest.raises(psycopg.OperationalError):
        survivor.execute("SELECT 1")
    survivor.close()
    assert cluster.port == port
    with psycopg.connect(dsn) as connection:
        assert connection.execute("SELECT n FROM kept").fetchall() == [(1,)]

    cluster.restart(mode="immediate")

    with psycopg.connect(dsn) as connection:
        assert connection.execute("SELECT n FROM kept").fetchall() == [(1,)]


@pytest.mark.slow
def test_cluster_fresh_db_is_migrated(cluster: ThrowawayCluster, schema_name: str) -> None:
    with psycopg.connect(cluster.fresh_db_dsn(schema=schema_name)) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema_name,)
        ).fetchone()
    assert row == (1,)
