"""Durable tasks as operators see them: ``pgqueue event send`` releases a
waiting job, ``pgqueue jobs show`` lists its steps and says what it waits for."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobContext
from tests.cli_support import assert_one_line_error, invoke, run_cli
from tests.http_support import Server, start_server
from tests.inprocess_worker import finished, quiet_structlog, run_until
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("quiet_structlog")
__all__ = ["quiet_structlog"]


def _register(app: pgqueue.App) -> None:
    @app.task(name="onboard", pass_context=True, max_attempts=1)
    def onboard(user: str, context: JobContext) -> Any:
        account = context.step("create_account", lambda: {"account": f"acc-{user}"})
        paid = context.wait_for_event(f"paid:{user}", timeout="1h")
        return {**account, "plan": paid["plan"]}


def test_the_cli_shows_steps_and_sends_the_event(app: pgqueue.App, db_dsn: str) -> None:
    _register(app)
    job_id = app.enqueue("onboard", {"user": "u1"}).job_id
    shown: list[str] = []
    sent = threading.Event()

    def operate() -> bool:
        if not sent.is_set():
            if app.get_job(job_id).status is not pgqueue.JobStatus.WAITING:
                return False
            show = invoke(db_dsn, "jobs", "show", str(job_id))
            assert show.exit_code == 0, show.output
            shown.append(show.stdout)
            done = run_cli(db_dsn, "event", "send", "paid:u1", "--payload", '{"plan": "pro"}')
            assert done.returncode == 0, done.stderr
            assert "released 1 waiting job" in done.stderr + done.stdout
            sent.set()
            return False
        return finished(app, job_id)()

    run_until(app, operate)
    text = shown[0]
    assert "steps" in text
    assert "create_account" in text
    assert "succeeded" in text
    assert '"account": "acc-u1"' in text
    assert "event:paid:u1" in text
    assert "waiting" in text
    assert "waits for event 'paid:u1' until" in " ".join(text.split())
    job = app.get_job(job_id)
    assert job.result == {"account": "acc-u1", "plan": "pro"}

    as_json = invoke(db_dsn, "jobs", "show", str(job_id), "--json")
    assert as_json.exit_code == 0
    steps = json.loads(as_json.stdout)["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [
        ("create_account", "succeeded"),
        ("event:paid:u1", "received"),
    ]
    assert steps[1]["result"] == {"plan": "pro"}


def test_event_send_refuses_bad_json_and_writes_nothing(app: pgqueue.App, db_dsn: str) -> None:
    assert_one_line_error(
        invoke(db_dsn, "event", "send", "k", "--payload", "{nope"), "--payload is not valid JSON"
    )
    result = invoke(db_dsn, "event", "send", "k", "--json")
    assert result.exit_code == 0, result.output
    assert '"released": 0' in result.stdout


# --- HTTP: POST /v1/events/{key} as a producer (a least-privilege role) ----------------


@pytest.fixture
def server(db_dsn: str, tmp_path: Path, roles: Roles) -> Iterator[Server]:  # noqa: F811
    yield from start_server(db_dsn, tmp_path, roles)


def test_a_producer_sends_an_event_over_http(server: Server, app: pgqueue.App, db_dsn: str) -> None:
    _register(app)
    job_id = app.enqueue("onboard", {"user": "h1"}).job_id
    answers: list[Any] = []

    def send() -> bool:
        if app.get_job(job_id).status is not pgqueue.JobStatus.WAITING:
            return False
        with server.client("producer") as http:
            answers.append(http.post("/v1/events/paid:h1", json={"payload": {"plan": "pro"}}))
            answers.append(http.post("/v1/events/paid:none", json={}))  # a null payload
            answers.append(http.post("/v1/events/paid:none"))  # no body: a null payload too
            answers.append(http.post("/v1/events/x", content=b" "))  # not JSON: refused
            answers.append(http.post("/v1/events/x", json={"payload": 1, "other": 2}))
        return True

    sent = threading.Event()

    def operate() -> bool:
        if not sent.is_set():
            if send():
                sent.set()
            return False
        return finished(app, job_id)()

    run_until(app, operate)
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].json() == {"key": "paid:h1", "released": 1}
    assert answers[1].json() == {"key": "paid:none", "released": 0}
    assert answers[2].json() == {"key": "paid:none", "released": 0}
    assert answers[3].status_code == 400
    assert answers[4].status_code == 422
    assert app.get_job(job_id).result == {"account": "acc-h1", "plan": "pro"}
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute("SELECT key, payload FROM pgqueue.events ORDER BY key").fetchall()
    assert rows == [("paid:h1", {"plan": "pro"}), ("paid:none", None)]


# --- the dashboard's job page --------------------------------------------------------


def test_the_dashboard_job_page_lists_steps_and_the_wait(app: pgqueue.App) -> None:
    from tests.dashboard_support import client

    _register(app)
    job_id = app.enqueue("onboard", {"user": "d1"}).job_id
    run_until(app, lambda: app.get_job(job_id).status is pgqueue.JobStatus.WAITING)
    with client(app) as c:
        page = c.get(f"/jobs/{job_id}")
        api = c.get(f"/api/jobs/{job_id}")
    assert page.status_code == 200
    html = page.text
    assert 'id="steps"' in html
    assert "create_account" in html
    assert "event:paid:d1" in html
    assert "waits for event &#39;paid:d1&#39;" in html or "waits for event 'paid:d1'" in html
    body = api.json()
    steps = body["job"]["steps"] if "job" in body else body["steps"]
    assert [s["status"] for s in steps] == ["succeeded", "waiting"]
