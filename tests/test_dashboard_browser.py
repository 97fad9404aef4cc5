"""The dashboard in a real browser: Debian's chromium driven by Playwright,
against `pgqueue dashboard` started as a user would start it.

Loads every page (saving a screenshot of each under build/dashboard-screenshots,
or $PGQUEUE_SCREENSHOTS), logs in, filters, paginates, opens a job, requeues a
dead-letter group, pauses a queue and checks the database each time; then
watches a live update arrive over server-sent events. Skipped, with the
reason printed, only when Playwright or the chromium binary is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pgqueue
from tests.dashboard_support import TOKEN, seed
from tests.fixtures.factory import JobFactory

CHROMIUM = os.environ.get("PGQUEUE_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SHOTS = Path(
    os.environ.get(
        "PGQUEUE_SCREENSHOTS", Path(__file__).parent.parent / "build" / "dashboard-screenshots"
    )
)


def _skip(reason: str) -> None:
    print(f"\nSKIPPED browser tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip("playwright is not installed (pip install playwright)")
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        _skip(f"no chromium at {CHROMIUM} (apt-get install -y chromium)")
    with sync_playwright() as p:
        try:
            instance = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        except Exception as exc:  # a broken install: say why, do not fail the suite
            _skip(f"chromium does not start: {exc}")
        yield instance
        instance.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(db_dsn: str) -> Iterator[str]:
    """`pgqueue dashboard` in a subprocess, with a token; its base URL."""
    port = _free_port()
    env = {**os.environ, "PGQUEUE_DSN": db_dsn, "PGQUEUE_DASHBOARD_TOKEN": TOKEN}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgqueue_cli",
            "dashboard",
            "--port",
            str(port),
            "--base-path",
            "/pgq",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}/pgq"
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"pgqueue dashboard exited: {process.stdout.read()}")  # type: ignore[union-attr]
                time.sleep(0.1)
        else:
            pytest.fail("pgqueue dashboard did not answer /healthz")
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_dashboard_in_chromium(browser: Any, server: str, job_factory: JobFactory) -> None:
    ids = seed(job_factory)
    job_factory.insert_many(120, task="bulk.task", queue="bulk")
    # A worker registered as pgqueue workers register (0013), for /workers.
    job_factory.conn.execute(
        "SELECT pgqueue.register_worker('web-1:4711:ab12cd', %s, 'web-1', 4711,"
        " ARRAY['mail', 'reports'], 8, ARRAY['mail.send', 'report.build'], %s)",
        ("s" * 48, pgqueue.__version__),
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    page.set_default_timeout(15_000)
    page.on("dialog", lambda dialog: dialog.accept())
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    # Login: a wrong token is refused, the right one lets us in.
    page.goto(server + "/")
    assert page.locator("input[name=token]").count() == 1
    page.fill("input[name=token]", "wrong")
    page.click("button[type=submit]")
    assert "wrong token" in page.content()
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_selector("table#queues")

    for path, name in (
        ("/", "overview"),
        ("/jobs", "jobs"),
        ("/dead", "dead"),
        ("/queues", "queues"),
        ("/schedules", "schedules"),
        ("/workers", "workers"),
        ("/tasks", "tasks"),
        (f"/jobs/{ids['dead17']}", "job"),
    ):
        response = page.goto(server + path)
        assert response is not None, path
        assert response.status == 200, path
        assert page.locator("header .brand").inner_text() == "pgqueue"
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        if name == "workers":
            row = page.locator("table#workers tbody tr").first.inner_text()
            assert "web-1:4711:ab12cd" in row
            assert pgqueue.__version__ in row

    # Filter: dead jobs of the mail queue only.
    page.goto(server + "/jobs")
    page.select_option("select[name=status]", "dead")
    page.select_option("select[name=queue]", "mail")
    page.click("#filters button[type=submit]")
    page.wait_for_url("**status=dead**")
    statuses = page.locator("#jobs tbody .status").all_inner_texts()
    assert statuses == ["dead", "dead", "dead"]

    # Paginate the bulk queue: 50 per page, older pages continue below.
    page.goto(server + "/jobs?queue=bulk")
    first = page.locator("#jobs tbody tr td:nth-child(2)").all_inner_texts()
    page.click("#next-page")
    page.wait_for_url("**cursor=**")
    second = page.locator("#jobs tbody tr td:nth-child(2)").all_inner_texts()
    assert len(first) == 50
    assert len(second) == 50
    assert int(second[0]) < int(first[-1])

    # Open a job from the list.
    page.click(f"#jobs a[href$='/jobs/{second[0]}']")
    page.wait_for_selector("#payload")
    assert f"Job {second[0]}" in page.locator("h1").inner_text()

    # Cancel two selected jobs, then everything the filter still matches.
    page.goto(server + "/jobs?queue=bulk")
    boxes = page.locator("#jobs tbody input[name=job_id]")
    chosen = [int(boxes.nth(i).get_attribute("value") or 0) for i in (0, 1)]
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.select_option("#bulk select[name=action]", "cancel")
    page.click("#bulk button[value=selected]")
    page.wait_for_selector(".flash")
    assert "2 of 2 selected" in page.locator(".flash").inner_text()
    assert [job_factory.row(i)["status"] for i in chosen] == ["cancelled", "cancelled"]
    page.goto(server + "/jobs?queue=bulk&status=queued")
    page.select_option("#bulk select[name=action]", "cancel")
    page.click("#bulk button[value=filter]")
    page.wait_for_selector("#progress-back")
    assert "118 jobs so far" in page.locator("#progress-count").inner_text()
    left = job_factory.conn.execute(
        "SELECT count(*) FROM pgqueue.jobs WHERE queue = 'bulk' AND status <> 'cancelled'"
    ).fetchone()
    assert left == (0,)

    # Requeue a dead-letter group: the three "user N not found" jobs.
    page.goto(server + "/dead")
    row = page.locator("#dead-groups tbody tr", has_text="mail.send")
    assert row.locator("td.num").inner_text() == "3"
    row.locator("button", has_text="Requeue group").click()
    page.wait_for_selector("#progress-back")
    page.screenshot(path=str(SHOTS / "requeue-progress.png"))
    for user in (17, 42, 99):
        assert job_factory.row(ids[f"dead{user}"])["status"] == "queued"
    assert job_factory.row(ids["dead_other"])["status"] == "dead"

    # Pause a queue from the queues page.
    page.goto(server + "/queues")
    page.locator("tr[data-queue=mail] button", has_text="Pause").click()
    page.wait_for_selector("tr[data-queue=mail] .paused")
    paused = job_factory.conn.execute(
        "SELECT paused FROM pgqueue.queues WHERE name = 'mail'"
    ).fetchone()
    assert paused == (True,)
    assert "paused" in page.locator(".flash").inner_text()

    # Live: a job in a new queue shows up on the open overview without a reload.
    page.goto(server + "/")
    page.wait_for_function("document.body.classList.contains('live-on')", timeout=10_000)
    job_factory.insert(task="live.task", queue="arrived-live")
    page.wait_for_selector("#queues >> text=arrived-live", timeout=15_000)
    page.screenshot(path=str(SHOTS / "overview-live.png"), full_page=True)
    assert errors == []
    page.close()
