"""Helpers of the dashboard tests: an in-process client, CSRF tokens, seeding."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("httpx", reason="httpx (the Starlette test client) is not installed")

with warnings.catch_warnings():  # starlette asks for httpx2; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import pgqueue
from pgqueue.dashboard import create_app
from tests.fixtures.factory import JobFactory

TOKEN = "t0ken-for-tests"
CSRF = re.compile(r'name="csrf-token" content="([^"]+)"')


@contextmanager
def client(app: pgqueue.App, **options: Any) -> Iterator[TestClient]:
    """A test client on one event loop for its whole life (the App's async
    pool is bound to it)."""
    options.setdefault("token", "")
    with TestClient(create_app(app, **options), base_url="http://127.0.0.1") as test_client:
        yield test_client


def csrf(test_client: TestClient, path: str = "/") -> str:
    """The CSRF token a page hands out (and its cookie, kept by the client)."""
    page = test_client.get(path)
    match = CSRF.search(page.text)
    assert match, page.text[:500]
    return match.group(1)


def login(test_client: TestClient, token: str = TOKEN) -> None:
    token_field = csrf(test_client, "/login")
    response = test_client.post(
        "/login",
        data={"csrf_token": token_field, "token": token, "next": "/"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text


def seed(factory: JobFactory) -> dict[str, int]:
    """A small but varied jobs table: every status, two queues, errors."""
    ids = {
        "queued": factory.insert(task="mail.send", queue="mail", payload={"to": "a@example.com"}),
        "scheduled": factory.insert(
            task="mail.send", queue="mail", status="scheduled", run_at=3600.0
        ),
        "running": factory.insert(task="report.build", queue="reports", status="running"),
        "succeeded": factory.insert(
            task="report.build", queue="reports", status="succeeded", result={"rows": 3}
        ),
        "cancelled": factory.insert(task="mail.send", queue="mail", status="cancelled"),
    }
    for user in (17, 42, 99):
        ids[f"dead{user}"] = factory.insert(
            task="mail.send",
            queue="mail",
            status="dead",
            attempts=5,
            last_error=f"KeyError: user {user} not found",
        )
    for attempt in range(1, 6):
        factory.insert_attempt(
            ids["dead17"],
            attempt=attempt,
            outcome="retry" if attempt < 5 else "failed",
            started_at=-60.0 * (6 - attempt),
            finished_at=-60.0 * (6 - attempt) + 0.2,
            error_code="KeyError",
            error_message="user 17 not found",
            traceback='Traceback (most recent call last):\n  File "shop/tasks.py", line 41, '
            "in send_mail\n    user = users[payload['user_id']]\nKeyError: 17",
        )
    ids["dead_other"] = factory.insert(
        task="report.build",
        queue="reports",
        status="dead",
        attempts=5,
        last_error="TimeoutError: query took 31s",
    )
    return ids


def status_of(factory: JobFactory, job_id: int) -> str:
    return str(factory.row(job_id)["status"])
