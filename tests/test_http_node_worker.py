"""#30 item 6: a worker in another language (Node, global ``fetch`` only:
examples/http_worker/worker.mjs) drains jobs through a live ``pgqueue
serve`` with a worker token. Skipped when node is not installed (fails
under CI=true)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import pgqueue
from tests.fixtures.cluster import free_port
from tests.fixtures.postgres import is_ci
from tests.http_support import Server, start_server, write_tokens
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)

WORKER = Path(__file__).resolve().parents[1] / "examples" / "http_worker" / "worker.mjs"


@pytest.fixture
def server(db_dsn: str, tmp_path: Path, roles: Roles) -> Iterator[Server]:  # noqa: F811
    yield from start_server(db_dsn, tmp_path, roles)


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        if is_ci(os.environ):
            pytest.fail("node is not installed: the HTTP worker example cannot run")
        pytest.skip("node is not installed")
    return node


def test_a_node_worker_drains_jobs_over_http(server: Server, app: pgqueue.App) -> None:
    node = node_binary()
    added = [app.enqueue("add", {"a": n, "b": 10}, queue="node").job_id for n in range(25)]
    upper = app.enqueue("upper", {"text": "hi"}, queue="node").job_id
    failing = app.enqueue("fail", queue="node", max_attempts=1).job_id
    unknown = app.enqueue("nosuch", queue="node").job_id
    elsewhere = app.enqueue("add", {"a": 1, "b": 1}, queue="other").job_id

    env = {**os.environ, "PGQUEUE_URL": server.url, "PGQUEUE_TOKEN": server.tokens["worker"],
           "PGQUEUE_EXIT_IDLE": "1"}  # fmt: skip
    done = subprocess.run(
        [node, str(WORKER), "node"], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["acked"] == 26

    for n, job_id in enumerate(added):
        job = app.get_job(job_id)
        assert job.status == "succeeded"
        assert job.result == {"sum": n + 10}
    assert app.get_job(upper).result == "HI"
    assert app.get_job(failing).status == "dead"
    assert "always fails" in (app.get_job(failing).last_error or "")
    assert app.get_job(unknown).status == "dead"
    assert app.get_job(elsewhere).status == "queued"


def test_the_node_worker_retries_a_server_that_is_not_up_yet(
    db_dsn: str, tmp_path: Path, roles: Roles, app: pgqueue.App  # noqa: F811
) -> None:
    """#44: the example retries "connection refused" with backoff, as it
    would through a restart of the server."""
    node = node_binary()
    jobs = [app.enqueue("add", {"a": n, "b": 1}, queue="node").job_id for n in range(5)]
    port = free_port()
    tokens = write_tokens(tmp_path / "tokens")  # the token the server will accept
    env = {**os.environ, "PGQUEUE_URL": f"http://127.0.0.1:{port}",
           "PGQUEUE_TOKEN": tokens["worker"], "PGQUEUE_EXIT_IDLE": "1",
           "PGQUEUE_RETRY_FOR": "60"}  # fmt: skip
    worker = subprocess.Popen(
        [node, str(WORKER), "node"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # it has been refused a few times by now
        assert worker.poll() is None
        for _server in start_server(db_dsn, tmp_path, roles, port=port, tokens=tokens):
            out, err = worker.communicate(timeout=120)
    finally:
        worker.kill()
    assert worker.returncode == 0, err
    assert "ECONNREFUSED" in err
    assert json.loads(out.strip().splitlines()[-1])["acked"] == 5
    assert [app.get_job(j).status for j in jobs] == ["succeeded"] * 5
