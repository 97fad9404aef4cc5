"""The raw-SQL floor: the least work a Postgres queue can do per job.

A minimal jobs table with a partial index over ready jobs in lease order;
COPY for bulk insert; one connection per worker process; lease 500 at a time
with a MATERIALIZED ``SKIP LOCKED`` CTE feeding an UPDATE; complete the whole
batch with one DELETE. Idle workers wait on LISTEN (one NOTIFY per enqueue
statement, never per row) with a 250 ms polling fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import psycopg

from benchmarks.adapters.base import System, serial_last_value
from benchmarks.common import WorkerControl

CHANNEL = "floor_jobs"
BATCH = 500

SCHEMA = """
CREATE TABLE jobs (
    id       bigserial PRIMARY KEY,
    queue    text        NOT NULL DEFAULT 'default',
    payload  jsonb       NOT NULL DEFAULT '{}',
    priority smallint    NOT NULL DEFAULT 0,
    run_at   timestamptz NOT NULL DEFAULT now(),
    status   smallint    NOT NULL DEFAULT 0  -- 0 ready, 1 leased
);
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE status = 0;
"""

LEASE = f"""
WITH c AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE queue = 'default' AND status = 0 AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT {BATCH}
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET status = 1 FROM c WHERE j.id = c.id
RETURNING j.id, j.payload
"""

COMPLETE = "DELETE FROM jobs WHERE id = ANY(%s)"

INSERT_ONE = f"""
WITH j AS (INSERT INTO jobs (payload) VALUES (%s::jsonb) RETURNING id)
SELECT id, pg_notify('{CHANNEL}', '') FROM j
"""


INSERT_PLAIN = "INSERT INTO jobs (payload) VALUES (%s::jsonb) RETURNING id"


def _noop(**_: Any) -> None:
    return None


class Floor(System):
    name: ClassVar[str] = "floor"
    label: ClassVar[str] = "raw-SQL floor"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._conn: psycopg.Connection[Any] | None = None

    @classmethod
    def version(cls) -> str:
        return f"psycopg {psycopg.__version__}"

    @classmethod
    def tuning(cls) -> dict[str, Any]:
        return {
            "lease": f"MATERIALIZED SKIP LOCKED CTE + UPDATE, {BATCH} per statement",
            "complete": "one DELETE ... WHERE id = ANY(ids) per batch",
            "bulk insert": "COPY + one NOTIFY",
            "single insert": "INSERT ... RETURNING id + pg_notify, autocommit",
            "connections": "1 per worker process (sync psycopg, autocommit)",
            "wake-up": "LISTEN on the worker connection, 250 ms poll fallback",
        }

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
        return self._conn

    def setup(self) -> None:
        self.conn.execute(SCHEMA)

    def bulk_enqueue(self, n: int) -> None:
        conn = self.conn
        with conn.transaction():
            with conn.cursor().copy("COPY jobs (payload) FROM STDIN") as copy:
                for _ in range(n):
                    copy.write_row(("{}",))
            conn.execute(f"SELECT pg_notify('{CHANNEL}', '')")

    def enqueue_one(self) -> int:
        row = self.conn.execute(INSERT_ONE, ("{}",)).fetchone()
        assert row is not None
        return int(row[0])

    def single_enqueue_variants(self) -> dict[str, Callable[[int], None]]:
        return {"plain_insert": self._plain_inserts}

    def _plain_inserts(self, n: int) -> None:
        """A bare single-row INSERT per transaction, without the NOTIFY."""
        conn = self.conn
        for _ in range(n):
            conn.execute(INSERT_PLAIN, ("{}",)).fetchone()

    def remaining(
        self, mon: psycopg.Connection[Any], upto_id: int | None, after_id: int = 0
    ) -> int:
        # Finished jobs are deleted: every row still present is unfinished.
        if upto_id is None:
            row = mon.execute("SELECT count(*) FROM jobs").fetchone()
        else:
            row = mon.execute(
                "SELECT count(*) FROM jobs WHERE id > %s AND id <= %s", (after_id, upto_id)
            ).fetchone()
        assert row is not None
        return int(row[0])

    def max_job_id(self, mon: psycopg.Connection[Any]) -> int:
        return serial_last_value(mon, "jobs")

    def soak_groups(self) -> dict[str, str]:
        return {"jobs": "jobs"}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @classmethod
    def worker_main(cls, dsn: str, ctl: WorkerControl) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            ctl.ready()
            ctl.wait_go()
            while not ctl.stop_requested():
                rows = conn.execute(LEASE).fetchall()
                if rows:
                    ids: list[int] = []
                    for job_id, payload in rows:
                        ctl.on_task_start(job_id)
                        _noop(**payload)
                        ids.append(job_id)
                    conn.execute(COMPLETE, (ids,))
                    continue
                for _ in conn.notifies(timeout=0.25, stop_after=1):
                    pass
        ctl.flush()
