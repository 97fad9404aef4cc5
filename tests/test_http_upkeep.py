"""#44: a deployment whose only workers speak HTTP is whole: ``pgqueue serve``
reaps expired leases and takes part in the maintenance election, unless
told not to. The workers here are real processes talking HTTP; no Python
worker runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.fixtures.workers import wait_until
from tests.http_support import Server, start_server
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)

# An HTTP worker that leases one job for a short lease, says so, and hangs
# (the test SIGKILLs it mid-lease).
HANGING_WORKER = textwrap.dedent(
    """
    import json, sys, time, httpx
    url, token = sys.argv[1], sys.argv[2]
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}) as http:
        answer = http.post("/v1/queues/default/lease",
                           json={"worker_id": "node-1", "lease_seconds": 1, "wait": 10})
        print(json.dumps(answer.json()), flush=True)
        time.sleep(600)
    """
)


def rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


@pytest.fixture
def reaping_server(db_dsn: str, tmp_path: Path, roles: Roles) -> Iterator[Server]:  # noqa: F811
    yield from start_server(db_dsn, tmp_path, roles, "--reap-interval", "0.5s", upkeep=True)


def test_only_http_workers_a_killed_ones_job_is_reclaimed_and_finished(
    reaping_server: Server, app: pgqueue.App
) -> None:
    server = reaping_server
    app.set_task_options("t", retry=pgqueue.Backoff(base=0.1, jitter=0.0))
    with server.client("producer") as http:
        job_id = http.post("/v1/jobs", json={"task": "t", "payload": {"n": 1}}).json()["job_id"]
    worker = subprocess.Popen(
        [sys.executable, "-c", HANGING_WORKER, server.url, server.tokens["worker"]],
        stdout=subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        [first] = json.loads(worker.stdout.readline())["jobs"]
        assert first["job_id"] == job_id
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.kill()
        worker.wait()
    assert app.get_job(job_id).status == "running"
    # The server's reaper takes the job back once the 1 s lease expired.
    wait_until(lambda: app.get_job(job_id).status == "queued", 30, "the reaper to reclaim it")
    with server.client("worker") as http:
        answer = http.post("/v1/queues/default/lease", json={"worker_id": "node-2", "wait": 10})
        [second] = answer.json()["jobs"]
        assert second["job_id"] == job_id
        assert second["attempt"] == 2
        acked = http.post(f"/v1/jobs/{job_id}/ack", json={"attempt_id": second["attempt_id"]})
        assert acked.status_code == 200, acked.text
    job = app.get_job(job_id, history=True)
    assert job.status == "succeeded"
    assert job.attempt_history is not None
    assert [a.worker_id for a in job.attempt_history] == ["node-1", "node-2"]
    assert job.attempt_history[0].outcome != "succeeded"
    # No Python worker ever ran: the server did the reaping and holds the maintenance turn.
    assert rows(app.dsn, "SELECT count(*) FROM pgqueue.workers") == [(0,)]
    wait_until(
        lambda: (rows(app.dsn, "SELECT holder FROM pgqueue.maintenance")[0][0] or "").startswith(
            "http:"
        ),
        30,
        "the server to take the maintenance turn",
    )


@pytest.fixture
def lazy_server(db_dsn: str, tmp_path: Path, roles: Roles) -> Iterator[Server]:  # noqa: F811
    yield from start_server(
        db_dsn, tmp_path, roles, "--no-reaper", "--no-maintenance", "--reap-interval", "0.5s",
        upkeep=True,
    )


def test_no_reaper_and_no_maintenance_opt_out(lazy_server: Server, app: pgqueue.App) -> None:
    server = lazy_server
    job_id = app.enqueue("t").job_id
    with server.client("worker") as http:
        [held] = http.post(
            "/v1/queues/default/lease", json={"worker_id": "w", "lease_seconds": 1}
        ).json()["jobs"]
    assert held["job_id"] == job_id
    time.sleep(3)  # six reap intervals past the lease's expiry: nothing reclaims it
    assert app.get_job(job_id).status == "running"
    assert rows(app.dsn, "SELECT holder FROM pgqueue.maintenance") == [(None,)]
    assert app.reap() == 1  # a worker (here, the API) would have


def test_bad_reap_interval_is_refused(db_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("admin " + "0" * 64 + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "pgqueue_cli", "serve", "--tokens", str(tmp_path / "tokens"),
         "--reap-interval", "0s"],
        capture_output=True, text=True, timeout=60, env={"PGQUEUE_DSN": db_dsn, "PATH": ""},
    )  # fmt: skip
    assert done.returncode != 0
    assert "--reap-interval" in done.stderr
