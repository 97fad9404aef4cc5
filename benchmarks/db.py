"""Database lifecycle and PostgreSQL statistics."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.common import DB_PREFIX, with_dbname

DB_COUNTERS = (
    "xact_commit",
    "xact_rollback",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
    "blks_read",
    "blks_hit",
)
TABLE_COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")


class MonitorConnection(psycopg.Connection[Any]):
    """The main process's polling connection; counts its statements so that its
    own autocommit transactions can be subtracted from ``xact_commit``."""

    statements: int = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return super().execute(*args, **kwargs)


class Server:
    """An admin connection to the maintenance database of the server under test."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def one(self, query: str, params: Any = None) -> Any:
        row = self.conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]

    # ---- lifecycle -------------------------------------------------------
    def create_db(self, name: str) -> str:
        assert re.fullmatch(r"[a-z0-9_]{1,63}", name), name
        self.conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        self.conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return with_dbname(self.dsn, name)

    def drop_db(self, name: str) -> None:
        self.conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def cleanup_stale(self) -> list[str]:
        names = [
            r[0]
            for r in self.conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                (DB_PREFIX.replace("_", r"\_") + "%",),
            ).fetchall()
        ]
        # Databases of a benchmark process still running (another run on this
        # machine) are not stale: their name carries that process's pid.
        stale = [n for n in names if not _pid_alive(n)]
        for n in stale:
            self.drop_db(n)
        return stale

    def wait_no_clients(self, dbname: str, timeout: float = 15.0, but: int = 0) -> bool:
        """Wait until no client backend is connected to ``dbname`` (but the one
        of pid ``but``): a backend flushes its pending statistics when it exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.one(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = %s AND backend_type = 'client backend' AND pid <> %s",
                (dbname, but),
            )
            if n == 0:
                return True
            time.sleep(0.05)
        return False

    def other_clients(self) -> list[str]:
        """Client sessions that are not this benchmark's (databases outside ``pgqb_*``)."""
        rows = self.conn.execute(
            "SELECT coalesce(datname, '?') || ' (' || coalesce(state, '?') || ')' "
            "FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND coalesce(datname, '') NOT LIKE %s",
            (DB_PREFIX.replace("_", r"\_") + "%",),
        ).fetchall()
        return sorted(r[0] for r in rows)

    # ---- facts -------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        names = (
            "server_version",
            "shared_buffers",
            "synchronous_commit",
            "fsync",
            "wal_level",
            "max_wal_size",
            "checkpoint_timeout",
            "autovacuum",
            "autovacuum_naptime",
            "full_page_writes",
            "max_connections",
            "work_mem",
        )
        rows = self.conn.execute(
            "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s)",
            (list(names),),
        ).fetchall()
        out: dict[str, Any] = {r[0]: r[1] for r in rows}
        out["version"] = self.one("SELECT version()")
        return out

    def checkpoint(self) -> None:
        self.conn.execute("CHECKPOINT")

    def wal_lsn(self) -> int:
        return int(self.one("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))

    def wal_stats(self) -> dict[str, int]:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
        ).fetchone()
        assert row is not None
        return {"wal_records": int(row[0]), "wal_fpi": int(row[1]), "wal_bytes": int(row[2])}

    def db_stats(self, dbname: str) -> dict[str, int]:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            sql.SQL("SELECT {} FROM pg_stat_database WHERE datname = %s").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in DB_COUNTERS)
            ),
            (dbname,),
        ).fetchone()
        assert row is not None
        return {c: int(v or 0) for c, v in zip(DB_COUNTERS, row, strict=True)}


def table_stats(dsn: str) -> dict[str, Any]:
    """Sums over the user tables of one database, plus per-table detail."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(
            """
            SELECT s.schemaname || '.' || s.relname,
                   s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del,
                   s.n_live_tup, s.n_dead_tup,
                   pg_table_size(s.relid), pg_indexes_size(s.relid),
                   s.autovacuum_count, s.autoanalyze_count
            FROM pg_stat_user_tables s
            ORDER BY 1
            """
        ).fetchall()
    tables: dict[str, dict[str, int]] = {}
    total: dict[str, int] = {
        k: 0
        for k in (
            *TABLE_COUNTERS,
            "n_live_tup",
            "n_dead_tup",
            "table_bytes",
            "index_bytes",
            "autovacuum_count",
        )
    }
    for r in rows:
        t = {
            "n_tup_ins": int(r[1]),
            "n_tup_upd": int(r[2]),
            "n_tup_hot_upd": int(r[3]),
            "n_tup_del": int(r[4]),
            "n_live_tup": int(r[5]),
            "n_dead_tup": int(r[6]),
            "table_bytes": int(r[7]),
            "index_bytes": int(r[8]),
            "autovacuum_count": int(r[9]),
        }
        tables[str(r[0])] = t
        for k in total:
            total[k] += t[k]
    return {"total": total, "tables": tables}


def _pid_alive(dbname: str) -> bool:
    """Whether the benchmark process named in ``pgqb_<pid>_...`` still runs."""
    parts = dbname[len(DB_PREFIX) :].split("_", 1)
    if not parts[0].isdigit():
        return False
    try:
        os.kill(int(parts[0]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
