"""The web dashboard over HTTP: pages, JSON, filters, pagination, auth,
read-only mode, CSRF, escaping and every action's effect in the database."""

from __future__ import annotations

import html
import itertools
import json
import subprocess
import sys

import pytest
import structlog

import pgqueue
from tests.cli_support import run_json
from tests.dashboard_support import TOKEN, client, csrf, login, seed, status_of
from tests.fixtures.factory import JobFactory
from tests.fixtures.workers import Workers, wait_until

PAGES = ("/", "/jobs", "/dead", "/queues", "/schedules", "/workers", "/tasks")


@pytest.fixture
def seeded(app: pgqueue.App, job_factory: JobFactory) -> dict[str, int]:
    return seed(job_factory)


def test_every_page_renders_the_data_and_says_read_only(
    app: pgqueue.App, seeded: dict[str, int]
) -> None:
    app.add_schedule("nightly", "0 3 * * *", "report.build", queue="reports")
    with client(app) as c:
        for path in (*PAGES, f"/jobs/{seeded['dead17']}"):
            page = c.get(path)
            assert page.status_code == 200, (path, page.text[:300])
            assert 'id="read-only-banner"' in page.text, path
            assert "PGQUEUE_DASHBOARD_TOKEN" in page.text, path
            assert page.headers["content-security-policy"].startswith("default-src 'self'")
        overview = c.get("/").text
        assert "mail" in overview
        assert "reports" in overview
        assert "<svg" in overview
        detail = c.get(f"/jobs/{seeded['dead17']}").text
        assert "KeyError" in detail
        assert "user 17 not found" in detail
        assert 'id="explain"' in detail
        assert "nightly" in c.get("/schedules").text
        assert "mail.send" in c.get("/tasks").text
        # Read-only: the action buttons are shown disabled.
        assert 'disabled title="read-only"' in c.get("/queues").text


def test_api_answers_with_the_cli_json_shapes(app: pgqueue.App, seeded: dict[str, int]) -> None:
    with client(app) as c:
        queues = c.get("/api/queues").json()
        mail = next(q for q in queues if q["queue"] == "mail")
        assert mail["queued"] == 1
        assert mail["scheduled"] == 1
        assert mail["dead"] == 3
        assert mail["cancelled"] == 1
        assert mail["paused"] is False
        assert mail["approximate"] == {}
        page = c.get("/api/jobs", params={"status": "dead", "queue": "mail"}).json()
        assert set(page) == {"jobs", "next_cursor"}
        assert {j["id"] for j in page["jobs"]} == {seeded[f"dead{u}"] for u in (17, 42, 99)}
        job = c.get(f"/api/jobs/{seeded['succeeded']}").json()
        assert job["result"] == {"rows": 3}
        assert job["status"] == "succeeded"
        assert isinstance(job["attempt_history"], list)
        # #44: a running attempt's lease token is not shown to dashboard readers.
        running_id = app.enqueue("t", queue="lease-token").job_id
        [held] = app.lease("lease-token", "w-dash", 1)
        [attempt] = c.get(f"/api/jobs/{running_id}").json()["attempt_history"]
        assert attempt["finished_at"] is None
        assert attempt["attempt_id"] is None
        stored = app.get_job(running_id, history=True).attempt_history
        assert stored is not None
        assert stored[0].attempt_id == held.attempt_id  # the Python API, as the owner, sees it
        groups = c.get("/api/dead").json()["groups"]
        assert sorted(g["count"] for g in groups) == [1, 3]
        assert c.get("/api/jobs/999999").status_code == 404
        assert c.get("/api/jobs", params={"status": "bogus"}).status_code == 400
        assert c.get("/healthz").json()["ok"] is True
        metrics = c.get("/metrics").text
        assert 'pgqueue_queue_jobs{queue="mail",status="dead"} 3' in metrics
        assert "pgqueue_workers_alive 0" in metrics


#: Values of each path parameter that name nothing (an id past bigint too).
#: Queues have none: a queue may be paused or limited before its first job.
UNKNOWN = {
    "job_id": ("999999999", "99999999999999999999"),
    "workflow_id": ("999999999", "99999999999999999999"),
    "name": ("no-such-schedule",),
}
NAMES_ANYTHING = {"queue"}


def test_every_route_that_takes_an_id_answers_404_for_an_unknown_one(app: pgqueue.App) -> None:
    from starlette.routing import Route

    auth = {"authorization": f"Bearer {TOKEN}"}
    checked: list[str] = []
    with client(app, token=TOKEN) as c:
        for route in c.app.routes:
            if not isinstance(route, Route) or not route.param_convertors:
                continue
            params = set(route.param_convertors)
            if params & NAMES_ANYTHING:
                continue
            assert params <= set(UNKNOWN), f"{route.path}: what value names nothing?"
            method = "GET" if "GET" in (route.methods or ()) else "POST"
            for n, accept in itertools.product(range(2), ("text/html", "application/json")):
                path = route.path_format.format(
                    **{k: v[-1 if n else 0] for k, v in UNKNOWN.items()}
                )
                answer = c.request(method, path, headers={**auth, "accept": accept})
                assert answer.status_code == 404, (method, path, answer.status_code, answer.text)
                if answer.headers["content-type"].startswith("text/html"):
                    message = html.unescape(answer.text)
                    assert "<h1>Not found</h1>" in message
                else:
                    message = answer.json()["error"]
                assert "does not exist" in message or "no schedule named" in message, message
            checked.append(route.path)
    # The pages, their JSON twins and the job actions.
    assert {
        "/jobs/{job_id:int}",
        "/api/jobs/{job_id:int}",
        "/workflows/{workflow_id:int}",
        "/api/workflows/{workflow_id:int}",
        "/actions/jobs/{job_id:int}/cancel",
    } <= set(checked)


def test_jobs_filters_and_keyset_pages(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_factory.insert_many(120, task="a", queue="q1")
    job_factory.insert_many(80, task="b", queue="q2", status="dead", finished=True)
    needle = job_factory.insert(task="a", queue="q1", payload={"order": "needle-7731"})
    failing = job_factory.insert(
        task="b", queue="q2", status="dead", last_error="ValueError: bad haystack-99"
    )
    with client(app) as c:
        first = c.get("/api/jobs", params={"queue": "q1"}).json()
        assert len(first["jobs"]) == 50
        assert first["jobs"][0]["id"] == needle
        seen = [j["id"] for j in first["jobs"]]
        cursor = first["next_cursor"]
        while cursor:
            page = c.get("/api/jobs", params={"queue": "q1", "cursor": cursor}).json()
            seen += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
        assert len(seen) == 121 == len(set(seen))
        assert seen == sorted(seen, reverse=True)
        # Finished jobs page by finish time (ties broken by id), newest first.
        page = c.get("/api/jobs", params={"status": "dead", "task": "b"}).json()
        dead = page["jobs"]
        while page["next_cursor"]:
            page = c.get(
                "/api/jobs", params={"status": "dead", "task": "b", "cursor": page["next_cursor"]}
            ).json()
            dead += page["jobs"]
        assert len(dead) == 81
        assert len({j["id"] for j in dead}) == 81
        assert dead[0]["id"] == failing
        assert all(j["status"] == "dead" for j in dead)
        found = c.get("/api/jobs", params={"q": "needle-7731"}).json()["jobs"]
        assert [j["id"] for j in found] == [needle]
        found = c.get("/api/jobs", params={"q": "haystack-99"}).json()["jobs"]
        assert [j["id"] for j in found] == [failing]
        # LIKE wildcards in the search text are literal.
        assert c.get("/api/jobs", params={"q": "%"}).json()["jobs"] == []
        listing = c.get("/jobs", params={"queue": "q1"}).text
        assert 'id="next-page"' in listing
        assert f"/jobs/{needle}" in listing
        assert c.get("/jobs", params={"queue": "bad queue!"}).status_code == 400


def test_read_only_refuses_every_action_with_403(
    app: pgqueue.App, seeded: dict[str, int], job_factory: JobFactory
) -> None:
    with client(app) as c, structlog.testing.capture_logs() as logs:
        token = csrf(c)
        for path, data in (
            (f"/actions/jobs/{seeded['queued']}/cancel", {}),
            (f"/actions/jobs/{seeded['dead17']}/requeue", {}),
            (f"/actions/jobs/{seeded['dead17']}/replay", {}),
            ("/actions/jobs", {"action": "cancel", "scope": "filter"}),
            ("/actions/queues/mail/pause", {}),
            ("/actions/queues/mail/limits", {"concurrency": "3"}),
        ):
            response = c.post(path, data={"csrf_token": token, **data})
            assert response.status_code == 403, path
            assert "read-only" in response.text
    assert status_of(job_factory, seeded["queued"]) == "queued"
    assert status_of(job_factory, seeded["dead17"]) == "dead"
    assert app.metrics("mail")["mail"].paused is False
    refusals = [e for e in logs if e["event"] == "dashboard action refused"]
    assert len(refusals) == 6
    assert all("read-only" in e["reason"] for e in refusals)


def test_read_only_flag_wins_over_a_token(app: pgqueue.App, seeded: dict[str, int]) -> None:
    with client(app, token=TOKEN, read_only=True) as c:
        response = c.post(
            "/actions/queues/mail/pause", headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert response.status_code == 403
    assert app.metrics("mail")["mail"].paused is False


def test_token_login_cookie_bearer_and_401(
    app: pgqueue.App, seeded: dict[str, int], job_factory: JobFactory
) -> None:
    with client(app, token=TOKEN) as c:
        anonymous = c.get("/")
        assert anonymous.status_code == 401
        assert 'name="token"' in anonymous.text
        assert "mail.send" not in anonymous.text
        assert c.get("/api/queues").status_code == 401
        assert c.get("/api/queues", headers={"authorization": "Bearer nope"}).status_code == 401
        assert c.get("/api/queues", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        # Wrong token in the form: 401, no session.
        field = csrf(c, "/login")
        wrong = c.post("/login", data={"csrf_token": field, "token": "nope"})
        assert wrong.status_code == 401
        assert c.get("/").status_code == 401
        # A Bearer client needs no CSRF token and gets JSON.
        paused = c.post("/actions/queues/mail/pause", headers={"authorization": f"Bearer {TOKEN}"})
        assert paused.status_code == 200
        assert paused.json()["paused"] is True
        assert (
            c.post(
                "/actions/queues/mail/resume", headers={"authorization": "Bearer nope"}
            ).status_code
            == 401
        )
        login(c)
        assert c.get("/").status_code == 200
        assert "read-only-banner" not in c.get("/").text
        # Every action form carries the CSRF token of the page.
        queues_page = c.get("/queues").text
        assert f'name="csrf_token" value="{csrf(c)}"' in queues_page
        # With the cookie, a POST without the CSRF token is refused.
        no_csrf = c.post(f"/actions/jobs/{seeded['queued']}/cancel")
        assert no_csrf.status_code == 403
        assert "CSRF" in no_csrf.text
        forged = c.post(f"/actions/jobs/{seeded['queued']}/cancel", data={"csrf_token": "x" * 40})
        assert forged.status_code == 403
        assert status_of(job_factory, seeded["queued"]) == "queued"
        cross = c.post(
            f"/actions/jobs/{seeded['queued']}/cancel",
            data={"csrf_token": csrf(c)},
            headers={"origin": "http://evil.example"},
        )
        assert cross.status_code == 403
        done = c.post(
            f"/actions/jobs/{seeded['queued']}/cancel",
            data={"csrf_token": csrf(c), "next": "/jobs"},
            follow_redirects=False,
        )
        assert done.status_code == 303
        assert done.headers["location"].startswith("/jobs?flash=")
        assert status_of(job_factory, seeded["queued"]) == "cancelled"
        # No open redirect through next=.
        away = c.post(
            f"/actions/jobs/{seeded['dead17']}/replay",
            data={"csrf_token": csrf(c), "next": "//evil.example/x"},
            follow_redirects=False,
        )
        assert away.headers["location"].startswith("/?flash=")
        assert "replayed as job" in c.get(away.headers["location"]).text
        # A crafted flash message (no signature) is not shown.
        assert "Call 555" not in c.get("/", params={"flash": "Call 555", "sig": "x"}).text
        assert c.get("/healthz").status_code == 200  # probes need no token


def test_authorize_callback_decides_each_action(app: pgqueue.App, seeded: dict[str, int]) -> None:
    asked: list[str] = []

    def authorize(request: object, action: str) -> bool:
        asked.append(action)
        return action != "pause"

    with client(app, authorize=authorize) as c:
        token = csrf(c)
        assert c.post("/actions/queues/mail/pause", data={"csrf_token": token}).status_code == 403
        ok = c.post(
            "/actions/queues/mail/limits",
            data={"csrf_token": token, "concurrency": "4", "rate": "10/1m"},
            follow_redirects=False,
        )
        assert ok.status_code == 303
    assert asked == ["pause", "limits"]
    mail = app.metrics("mail")["mail"]
    assert mail.paused is False
    assert mail.concurrency_limit == 4
    assert mail.rate_limit == "10/1m"


XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_every_user_controlled_string_is_escaped(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_id = job_factory.insert(
        task=f"task{XSS}",
        queue=f"queue{XSS}",
        status="dead",
        attempts=5,
        payload={"name": XSS, XSS: 1},
        last_error=f"Boom{XSS}: message {XSS}",
    )
    job_factory.insert_attempt(
        job_id, error_code=f"Boom{XSS}", error_message=XSS, traceback=f"Traceback {XSS}"
    )
    app.add_schedule(f"sched{XSS}"[:60], "0 3 * * *", f"task{XSS}")
    with client(app) as c:
        for path in (*PAGES, f"/jobs/{job_id}"):
            body = c.get(path).text
            assert "<script>alert" not in body, path
            assert "<img src=x" not in body, path
        detail = c.get(f"/jobs/{job_id}").text
        assert html.escape("<script>") in detail or "&lt;script&gt;" in detail
        assert "&lt;script&gt;" in c.get("/dead").text
        assert "&lt;script&gt;" in c.get("/").text
        assert "Traceback &lt;script&gt;" in detail
        assert "<script>" not in c.get("/metrics").text.split("\n", 1)[0]


def test_bulk_actions_in_batches_with_progress(
    app: pgqueue.App, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgqueue.dashboard import actions

    monkeypatch.setattr(actions, "TIME_BUDGET", 0.0)  # one batch of 500 per request
    job_factory.insert_many(1_100, task="bulk", queue="bulkq")
    keep = job_factory.insert(task="other", queue="bulkq")
    with client(app, token=TOKEN) as c:
        auth = {"authorization": f"Bearer {TOKEN}"}
        total, cursor, rounds = 0, "", 0
        with structlog.testing.capture_logs() as logs:
            while True:
                rounds += 1
                step = c.post(
                    "/actions/jobs",
                    headers=auth,
                    data={
                        "action": "cancel",
                        "scope": "filter",
                        "queue": "bulkq",
                        "task": "bulk",
                        "cursor": cursor,
                        "total": str(total),
                    },
                ).json()
                total, cursor = step["total"], step["cursor"]
                if step["done"]:
                    break
                assert rounds < 20
        assert total == 1_100
        assert rounds == 3
        actions = [e for e in logs if e["event"] == "dashboard action"]
        assert actions
        assert actions[0]["who"].startswith("bearer@")
        assert actions[0]["action"] == "bulk"
        assert "bulkq" in actions[0]["target"]
        assert sum(e["count"] for e in actions) == 1_100
        counts = dict(
            job_factory.conn.execute(
                "SELECT status::text, count(*) FROM pgqueue.jobs WHERE queue = 'bulkq' GROUP BY 1"
            ).fetchall()
        )
        assert counts == {"cancelled": 1_100, "queued": 1}
        assert status_of(job_factory, keep) == "queued"
        # Selected ids: replay two of them.
        ids = [
            r[0]
            for r in job_factory.conn.execute(
                "SELECT id FROM pgqueue.jobs WHERE task = 'bulk' ORDER BY id LIMIT 2"
            ).fetchall()
        ]
        replayed = c.post(
            "/actions/jobs",
            headers=auth,
            data={"action": "replay", "job_id": [str(i) for i in ids]},
        ).json()
        assert replayed["count"] == 2
        live = job_factory.conn.execute(
            "SELECT count(*) FROM pgqueue.jobs WHERE task = 'bulk' AND status = 'queued'"
        ).fetchone()
        assert live == (2,)
        bad = c.post("/actions/jobs", headers=auth, data={"action": "explode", "job_id": "1"})
        assert bad.status_code == 400


def test_requeue_a_dead_letter_group(
    app: pgqueue.App, job_factory: JobFactory, seeded: dict[str, int]
) -> None:
    with client(app, token=TOKEN) as c:
        login(c)
        groups = c.get("/api/dead").json()["groups"]
        users = next(g for g in groups if g["task"] == "mail.send")
        assert users["count"] == 3
        assert users["error_code"] == "KeyError"
        assert users["queues"] == ["mail"]
        page = c.post(
            "/actions/dead/requeue", data={"csrf_token": csrf(c, "/dead"), "group": users["key"]}
        )
        assert page.status_code == 200
        assert "done" in page.text
    for user in (17, 42, 99):
        assert status_of(job_factory, seeded[f"dead{user}"]) == "queued"
    assert status_of(job_factory, seeded["dead_other"]) == "dead"


def test_group_requeue_runs_in_bounded_batches(app: pgqueue.App, job_factory: JobFactory) -> None:
    for i in range(30):
        job_factory.insert(task="t", status="dead", last_error=f"IOError: disk {i} full")
    job_factory.insert(task="t", status="dead", last_error="IOError: another thing")
    import asyncio

    from pgqueue.dashboard import actions
    from pgqueue.dashboard.data import Data

    async def run() -> tuple[int, int]:
        groups, _ = await Data(app).dead_groups()
        group = next(g for g in groups if g.count == 30)
        total, cursor, rounds = 0, None, 0
        while True:
            rounds += 1
            progress = await actions.requeue_group(
                Data(app), (group.task, group.error_code, group.fingerprint), cursor, total, batch=7
            )
            total, cursor = progress.total, progress.cursor
            if progress.done:
                return total, rounds

    total, _ = asyncio.run(run())
    app._database.close()
    assert total == 30
    left = job_factory.conn.execute(
        "SELECT last_error FROM pgqueue.jobs WHERE status = 'dead'"
    ).fetchall()
    assert left == [("IOError: another thing",)]


def test_queue_and_schedule_actions(app: pgqueue.App, seeded: dict[str, int]) -> None:
    app.add_schedule("hourly", "0 * * * *", "report.build", queue="reports")
    auth = {"authorization": f"Bearer {TOKEN}"}
    with client(app, token=TOKEN) as c:
        assert c.post("/actions/queues/mail/pause", headers=auth).status_code == 200
        assert app.metrics("mail")["mail"].paused is True
        assert "paused" in c.get("/queues", headers=auth).text
        assert c.post("/actions/queues/mail/resume", headers=auth).status_code == 200
        assert app.metrics("mail")["mail"].paused is False
        bad = c.post("/actions/queues/mail/limits", headers=auth, data={"concurrency": "x"})
        assert bad.status_code == 400
        assert (
            c.post("/actions/schedules/hourly/disable", headers=auth).json()["schedule"]["enabled"]
            is False
        )
        assert app.get_schedule("hourly").enabled is False
        assert c.post("/actions/schedules/hourly/enable", headers=auth).status_code == 200
        ran = c.post("/actions/schedules/hourly/run", headers=auth).json()
        assert app.get_job(ran["job_id"]).task == "report.build"
        assert c.post("/actions/schedules/nope/run", headers=auth).status_code == 404


def test_capped_counts_never_count_everything(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_factory.insert_many(10_050, queue="big")
    job_factory.insert_many(10_050, queue="big", status="dead", finished=True)
    job_factory.conn.execute("ANALYZE pgqueue.jobs")
    with client(app) as c:
        overview = c.get("/").text
        assert "10,000+" in overview
        big = next(q for q in c.get("/api/queues").json() if q["queue"] == "big")
        assert big["approximate"]["queued"] == "capped"
        assert big["approximate"]["dead"] == "estimate"
        assert 9_000 < big["dead"] < 12_000


def test_cli_without_the_extra_keeps_working_and_imports_nothing_of_it() -> None:
    code = (
        "import sys, pgqueue, pgqueue_cli.main;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('starlette', 'jinja2', 'uvicorn')"
        " or m == 'pgqueue.dashboard'];"
        "print(json.dumps(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_live_updates_share_one_listener_and_coalesce(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    import asyncio

    from pgqueue.dashboard.data import Data
    from pgqueue.dashboard.live import LiveHub

    async def run() -> tuple[int, list[int], int]:
        hub = LiveHub(Data(app), min_interval=0.2, mark_interval=0.5)
        queues = [hub.subscribe() for _ in range(50)]
        try:
            await asyncio.sleep(0.5)  # the listener is up
            # A burst of enqueues (each notifies) ...
            for i in range(100):
                await app.enqueue_async("burst", {"i": i}, queue="live")
            got = await asyncio.wait_for(asyncio.gather(*(q.get() for q in queues)), timeout=20)
            assert set(got) == {"refresh"}
            row = job_factory.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'pgqueue-events'"  # the App's one listener
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            listeners = row[0] if row else 0
            # ... and an ack (no NOTIFY) is seen through the change mark.
            job_factory.insert(task="quiet", status="succeeded")
            again = await asyncio.wait_for(queues[0].get(), timeout=20)
            assert again == "refresh"
            return hub.connections_opened, [q.qsize() for q in queues], listeners
        finally:
            await hub.close()
            await app.close_async()

    opened, pending, listeners = asyncio.run(run())
    assert opened == 1
    assert listeners == 1
    # Coalesced: at most one refresh waits per browser, however many events.
    assert max(pending) <= 1


def test_a_change_after_the_stream_opens_is_never_missed(
    app: pgqueue.App, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    from types import SimpleNamespace

    from pgqueue.dashboard import pages
    from pgqueue.dashboard.data import Data
    from pgqueue.dashboard.live import LiveHub

    # A slow mark read widens the window in which the hub, had the stream
    # opened before its first mark, would take the change below for its
    # starting state and never announce it.
    original = Data.change_mark

    async def slow_mark(self: Data) -> tuple[object, ...]:
        await asyncio.sleep(1.0)
        return await original(self)

    monkeypatch.setattr(Data, "change_mark", slow_mark)

    async def run() -> str:
        hub = LiveHub(Data(app), min_interval=0.1, mark_interval=0.3)
        response = await pages.events(SimpleNamespace(live=hub), None)  # type: ignore[arg-type]
        body = response.body_iterator
        try:
            assert (await body.__anext__()).startswith("retry:")  # the browser's "open"
            # A change that does not notify: only the change mark shows it.
            job_factory.insert(task="quiet", status="succeeded")
            return str(await asyncio.wait_for(body.__anext__(), timeout=12))
        finally:
            await body.aclose()  # type: ignore[attr-defined]
            await hub.close()
            await app.close_async()

    assert asyncio.run(run()).startswith("event: refresh")


def test_served_alone_it_closes_its_connections_when_the_server_stops(
    app: pgqueue.App, db_dsn: str
) -> None:
    import psycopg

    def others() -> int:
        with psycopg.connect(db_dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        return int(row[0]) if row else 0

    with client(app) as c:
        assert c.get("/jobs").status_code == 200
        during = others()
    assert during >= 1  # the App's async pool, on the server's event loop
    # Its lifespan's shutdown closed that pool before the loop ended.
    wait_until(lambda: others() == 0, 10, "the dashboard's connections to close")


def test_cli_rejects_a_bad_base_path_before_connecting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue_cli", "dashboard", "--base-path", "/a b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "--base-path must be a URL path" in result.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "pgqueue_cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "dashboard" in listed.stdout


def test_html_progress_continues_until_done(
    app: pgqueue.App, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from pgqueue.dashboard import actions

    monkeypatch.setattr(actions, "TIME_BUDGET", 0.0)  # one batch per request
    monkeypatch.setattr(actions, "BATCH", 200)
    job_factory.insert_many(450, task="many", queue="m", status="dead", finished=True)
    with client(app, token=TOKEN) as c:
        login(c)
        group = next(g for g in c.get("/api/dead").json()["groups"] if g["task"] == "many")
        fields = {"csrf_token": csrf(c, "/dead"), "group": group["key"], "next": "/dead"}
        pages = 0
        while True:
            pages += 1
            page = c.post("/actions/dead/requeue", data=fields, headers={"hx-request": "true"})
            assert page.status_code == 200
            if 'id="progress-back"' in page.text:
                break
            assert 'hx-trigger="load' in page.text
            form = page.text[page.text.index('id="progress"') :]
            found = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)
            fields = {k: html.unescape(v) for k, v in found}
            assert pages < 10
        assert "450 jobs so far" in page.text
    assert pages == 3
    left = job_factory.conn.execute(
        "SELECT count(*) FROM pgqueue.jobs WHERE task = 'many' AND status = 'dead'"
    ).fetchone()
    assert left == (0,)


def test_sessions_expire_and_cannot_be_forged(app: pgqueue.App) -> None:
    import time

    with client(app, token=TOKEN) as c:
        guard = c.app.state.dashboard.guard  # type: ignore[attr-defined]
        c.cookies.set("pgqueue_session", guard.session_value(now=time.time() - 13 * 3600))
        assert c.get("/").status_code == 401
        fresh = guard.session_value()
        body, _, signature = fresh.rpartition(".")
        nonce, _, expires = body.partition(".")
        c.cookies.set("pgqueue_session", f"{nonce}.{int(expires) + 10**6}.{signature}")
        assert c.get("/").status_code == 401
        c.cookies.set("pgqueue_session", fresh)
        assert c.get("/").status_code == 200


def test_concurrent_page_reads_share_one_database_read(
    app: pgqueue.App, seeded: dict[str, int]
) -> None:
    import asyncio

    from pgqueue.dashboard.data import Data

    data = Data(app, ttl=30.0)

    async def run() -> tuple[int, int]:
        try:
            await asyncio.gather(*(data.queues() for _ in range(50)))
            first = data.reads
            data.invalidate()  # what an action does
            await data.queues()
            return first, data.reads
        finally:
            await app.close_async()

    first, after = asyncio.run(run())
    assert first == 1
    assert after == 2


def test_mounted_in_a_host_app_under_a_prefix(app: pgqueue.App, seeded: dict[str, int]) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from pgqueue.dashboard import create_app
    from tests.dashboard_support import TestClient

    host = Starlette(
        routes=[Mount("/ops/queue", create_app(app, authorize=lambda request, action: True))]
    )
    with TestClient(host, base_url="http://127.0.0.1") as c:
        page = c.get("/ops/queue/jobs")
        assert page.status_code == 200
        assert 'href="/ops/queue/dead"' in page.text
        assert 'src="/ops/queue/static/htmx.min.js"' in page.text
        assert c.get("/ops/queue/static/htmx.min.js").status_code == 200
        token = csrf(c, "/ops/queue/queues")
        done = c.post(
            "/ops/queue/actions/queues/mail/pause",
            data={"csrf_token": token, "next": "/ops/queue/queues"},
            follow_redirects=False,
        )
        assert done.status_code == 303
        assert done.headers["location"].startswith("/ops/queue/queues?flash=")
    assert app.metrics("mail")["mail"].paused is True


def test_cli_refuses_an_unusable_database_with_the_reason(db_dsn: str) -> None:
    import os

    env = {**os.environ, "PGQUEUE_DSN": db_dsn}
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue_cli", "--schema", "nothere", "dashboard", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 1
    assert "nothere" in result.stderr
    assert "migrate" in result.stderr


def test_tasks_and_workers_pages_show_the_task_registry(
    app: pgqueue.App, db_dsn: str, workers: Workers
) -> None:
    """/tasks: statistics, live settings, limits and unknown tasks from the
    task registry; /workers: the registry's workers with their version. The
    API answers with the CLI's --json shapes."""
    worker = workers.spawn("--concurrency", "2", app="tests.apps.registry:app_without_mail")
    worker.wait_registered()
    app.set_task_limit("reg_mail", concurrency=3, rate="10/1m")
    app.set_task_options("reg_mail", lease_seconds=120)
    app.enqueue("reg_mail", {"to": "a@b.c"})
    wait_until(app.unknown_tasks, 30.0, "the worker to hand back the unknown task", [worker])
    with client(app, cache_ttl=0) as c:
        page = c.get("/tasks").text
        assert "reg_mail" in page
        assert "unknown: 1 jobs waiting" in page
        assert "concurrency 3, rate 10/60s" in page
        api = c.get("/api/tasks").json()
        assert [u["task"] for u in api["unknown_tasks"]] == ["reg_mail"]
        listed = {t["name"]: t for t in api["tasks"]}
        assert listed["reg_mail"]["settings"]["concurrency"] == 3
        assert listed["reg_mail"]["settings"]["lease_seconds"] == 120
        assert set(listed) == {t["name"] for t in run_json(db_dsn, "task", "list")}
        assert set(api["stats"]) == set(run_json(db_dsn, "task", "stats"))

        row = worker.wait_registered()
        page = c.get("/workers").text
        assert html.escape(row["id"]) in page
        assert pgqueue.__version__ in page
        served = c.get("/api/workers").json()
        cli = run_json(db_dsn, "workers", "list")
        assert [w["id"] for w in served] == [w["id"] for w in cli] == [row["id"]]
        assert set(served[0]) == set(cli[0])
        assert served[0]["version"] == pgqueue.__version__
        assert served[0]["state"] == "alive"
