"""Database faults a test injects from a session of its own, as production
sees them: a migration's ACCESS EXCLUSIVE lock, a deadlock with a worker's
statement, the database turning read-only (a failover to a standby)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

# The tables a worker's statements touch (jobs_archive is only for `archive`).
QUEUE_TABLES = ("jobs", "job_attempts", "queues", "queue_lease_log", "workers", "schedules")


@contextmanager
def locked(dsn: str, table: str) -> Iterator[None]:
    """ACCESS EXCLUSIVE on pgqueue.<table> for the block, as a migration takes it."""
    with psycopg.connect(dsn, application_name="fault-locker") as conn:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier("pgqueue", table)
            )
        )
        yield
        conn.rollback()


def deadlock_with_a_worker(dsn: str, deadline: float) -> bool:
    """Make one of the worker's statements a deadlock victim; True when it was.

    This session takes ACCESS EXCLUSIVE on a table; when a worker statement
    waits for it while holding a lock on another table, this session asks for
    that table too. The cycle is closed by this session, but its
    deadlock_timeout is long: the worker's (1 s, from its DSN) runs out first
    and PostgreSQL cancels the worker's statement with 40P01.
    """
    with psycopg.connect(dsn, application_name="fault-locker") as conn:
        conn.execute("SET deadlock_timeout = '60s'")
        for table in QUEUE_TABLES * 3:
            if time.monotonic() > deadline:
                return False
            conn.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    sql.Identifier("pgqueue", table)
                )
            )
            other = held_by_a_waiter(dsn, table, time.monotonic() + 3.0)
            if other is not None:
                try:
                    conn.execute(
                        sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                            sql.Identifier("pgqueue", other)
                        )
                    )
                except psycopg.errors.DeadlockDetected:
                    # Found too late: the worker's one deadlock check had run
                    # (no cycle yet), so this session's own check chose it.
                    conn.rollback()
                    continue
                conn.rollback()
                return True
            conn.rollback()
    return False


def held_by_a_waiter(dsn: str, table: str, until: float) -> str | None:
    """A queue table locked by a worker backend that waits for ``table``."""
    query = """
        SELECT other.relname
        FROM pg_locks waiting
        JOIN pg_stat_activity a ON a.pid = waiting.pid AND a.application_name = 'pgqueue'
        JOIN pg_locks held ON held.pid = waiting.pid AND held.granted
        JOIN pg_class other ON other.oid = held.relation AND other.relkind = 'r'
        JOIN pg_namespace n ON n.oid = other.relnamespace AND n.nspname = 'pgqueue'
        WHERE NOT waiting.granted AND waiting.relation = %s::regclass
          AND other.relname <> %s
        LIMIT 1"""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < until:
            row = conn.execute(query, (f"pgqueue.{table}", table)).fetchone()
            if row is not None:
                return str(row[0])
            time.sleep(0.02)
    return None


def set_read_only(dsn: str, on: bool) -> None:
    writable = make_conninfo(dsn, options="-c default_transaction_read_only=off")
    with psycopg.connect(writable, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = {}").format(
                sql.Identifier(dbname), sql.SQL("on" if on else "off")
            )
        )


def terminate_sessions(dsn: str, *applications: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND application_name = ANY(%s)",
            (list(applications),),
        ).fetchall()
    return len(rows)
