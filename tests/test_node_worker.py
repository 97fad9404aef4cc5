"""#18 item 4: a worker in another language (Node, ``pg`` from npm) drains
jobs enqueued from Python through the SQL worker API, as a role granted
``pgqueue grant --worker`` only. Skipped, with the reason, when node or the
``pg`` package is not available."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

import pgqueue
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "node_worker"


def libpq_env(dsn: str) -> dict[str, str]:
    """The DSN as libpq environment variables (which node-postgres reads too)."""
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "password": "PGPASSWORD",
             "dbname": "PGDATABASE"}  # fmt: skip
    return {names[k]: str(v) for k, v in conninfo_to_dict(dsn).items() if k in names}


@pytest.fixture(scope="module")
def node_worker() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed: the Node worker example cannot run")
    if not (EXAMPLE / "node_modules" / "pg").is_dir():
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund"],
            cwd=EXAMPLE,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"npm could not install the pg package: {done.stderr.strip()[-300:]}")
    return EXAMPLE / "worker.js"


def test_a_node_worker_drains_jobs_enqueued_from_python(
    node_worker: Path,
    db_dsn: str,
    roles: Roles,  # noqa: F811
) -> None:
    worker_role = roles.create(db_dsn, "pgq_node", kind="worker")
    with pgqueue.App(db_dsn) as app:
        added = [app.enqueue("add", {"a": n, "b": 10}, queue="node").job_id for n in range(20)]
        failing = app.enqueue("fail", queue="node", max_attempts=2).job_id
        unknown = app.enqueue("nosuch", queue="node").job_id
        elsewhere = app.enqueue("add", {"a": 1, "b": 1}, queue="other").job_id

        done = subprocess.run(
            ["node", str(node_worker), "--queue", "node", "--until-idle", "4"],
            env={**libpq_env(worker_role.dsn), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary == {"acked": 20, "failed": 3, "lost": 0}

        for n, job_id in enumerate(added):
            job = app.get_job(job_id)
            assert (job.status, job.result, job.attempts) == ("succeeded", n + 10, 1)
        dead = app.get_job(failing, history=True)
        assert dead.status == "dead"
        assert [a.outcome for a in dead.attempt_history] == ["failed", "failed"]
        assert dead.last_error == "error: this task always fails"
        assert app.get_job(unknown).status == "dead"
        assert app.get_job(elsewhere).status == "queued"
