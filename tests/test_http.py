"""#30: the HTTP API, driven over HTTP against ``pgqueue serve`` as a process,
with producer, worker and admin tokens whose kinds run as roles granted by
``pgqueue grant``. Assertions are on the answers and on the database."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.errors import InvalidOption
from pgqueue.http.tokens import Tokens, hash_token
from tests.fixtures.dbstate import snapshot
from tests.fixtures.workers import wait_until
from tests.http_support import Server, start_server
from tests.test_security_grants import Roles, roles  # noqa: F401 (fixture)


@pytest.fixture
def server(db_dsn: str, tmp_path: Path, roles: Roles) -> Iterator[Server]:  # noqa: F811
    yield from start_server(db_dsn, tmp_path, roles)


def scalar(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def leased(server: Server, queue: str = "default", **body: Any) -> list[dict[str, Any]]:
    with server.client("worker") as http:
        answer = http.post(f"/v1/queues/{queue}/lease", json={"worker_id": "w1", **body})
    assert answer.status_code == 200, answer.text
    jobs: list[dict[str, Any]] = answer.json()["jobs"]
    return jobs


# --- the round trip ----------------------------------------------------------------------


def test_producer_enqueues_worker_leases_and_acks(server: Server, app: pgqueue.App) -> None:
    with server.client("producer") as http:
        answer = http.post(
            "/v1/jobs",
            json={
                "task": "send",
                "payload": {"to": "a@b.c"},
                "queue": "mail",
                "priority": 3,
                "dedup_key": "m1",
                "max_attempts": 2,
            },
        )
        assert answer.status_code == 201, answer.text  # created
        job_id = answer.json()["job_id"]
        assert answer.json() == {"job_id": job_id, "created": True}
        again = http.post("/v1/jobs", json={"task": "send", "queue": "mail", "dedup_key": "m1"})
        assert again.status_code == 200, again.text  # the live job of that key: nothing created
        assert again.json() == {"job_id": job_id, "created": False}
    job = app.get_job(job_id)
    assert (job.task, job.queue, job.payload, job.priority, job.max_attempts) == (
        "send",
        "mail",
        {"to": "a@b.c"},
        3,
        2,
    )

    [lease] = leased(server, "mail", max=5, lease_seconds=300)
    assert lease["job_id"] == job_id
    assert lease["attempt"] == 1
    assert lease["task"] == "send"
    assert lease["payload"] == {"to": "a@b.c"}
    assert app.get_job(job_id).status == "running"
    # lease_seconds: the lease runs to about now + 300 s
    expires = scalar(
        app.dsn,
        "SELECT extract(epoch FROM lease_expires_at - now()) FROM pgqueue.jobs WHERE id = %s",
        (job_id,),
    )
    assert 250 < float(expires) <= 300

    with server.client("worker") as http:
        done = http.post(
            f"/v1/jobs/{job_id}/ack",
            json={"attempt_id": lease["attempt_id"], "result": {"sent": True}},
        )
        assert done.status_code == 200, done.text
        assert done.json() == {"job_id": job_id, "acked": True}
        shown = http.get(f"/v1/jobs/{job_id}", params={"history": "true"}).json()
    assert shown["status"] == "succeeded"
    assert shown["result"] == {"sent": True}
    assert [a["outcome"] for a in shown["attempt_history"]] == ["succeeded"]
    assert app.get_job(job_id).result == {"sent": True}


def test_every_kind_reads_jobs_and_metrics(server: Server, app: pgqueue.App) -> None:
    job_id = app.enqueue("t", queue="q1").job_id
    app.enqueue("t", queue="q1", delay=3600)
    for kind in ("producer", "worker", "admin"):
        with server.client(kind) as http:
            assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
            metrics = http.get("/v1/queues/q1/metrics")
            assert metrics.status_code == 200, metrics.text
            assert metrics.json()["queue"] == "q1"
            assert (metrics.json()["queued"], metrics.json()["scheduled"]) == (1, 1)
            assert http.get("/v1/queues/nothing-here/metrics").json()["queued"] == 0
            assert http.get("/v1/jobs/999999").status_code == 404


# --- tokens and roles ---------------------------------------------------------------------


def test_missing_or_unknown_token_is_401_and_wrong_kind_403(
    server: Server, app: pgqueue.App
) -> None:
    job_id = app.enqueue("t").job_id
    before = snapshot(app.dsn)
    with server.client() as anonymous:
        for headers in (
            {},
            {"authorization": "Bearer nope"},
            {"authorization": "Basic eDp5"},
            {"authorization": f"Bearer {server.tokens['producer']}x"},
        ):
            answer = anonymous.post("/v1/jobs", json={"task": "t"}, headers=headers)
            assert answer.status_code == 401, headers
            assert answer.json()["error"] == "unauthorized"
            assert answer.headers["www-authenticate"] == "Bearer"
    refused = [
        ("producer", "POST", "/v1/queues/default/lease", {}),
        ("producer", "POST", f"/v1/jobs/{job_id}/ack", {"attempt_id": 1}),
        ("producer", "POST", "/v1/ack", {"acks": [{"job_id": job_id, "attempt_id": 1}]}),
        ("producer", "POST", f"/v1/jobs/{job_id}/requeue", None),
        ("worker", "POST", f"/v1/jobs/{job_id}/requeue", None),
    ]
    for kind, method, path, body in refused:
        with server.client(kind) as http:
            answer = http.request(method, path, json=body)
        assert answer.status_code == 403, (kind, path, answer.text)
        assert answer.json()["error"] == "forbidden"
    assert snapshot(app.dsn) == before


def test_requests_run_as_the_granted_role_of_their_kind(server: Server, app: pgqueue.App) -> None:
    job_id = app.enqueue("t").job_id
    # The producer role may not cancel (the default grant): the database refuses.
    with server.client("producer") as http:
        answer = http.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 403
    assert "refused" in answer.json()["message"]
    assert app.get_job(job_id).status == "queued"
    with server.client("admin") as http:
        assert http.post(f"/v1/jobs/{job_id}/cancel").json() == {
            "job_id": job_id,
            "status": "cancelled",
        }
        again = http.post(f"/v1/jobs/{job_id}/cancel")
        assert again.status_code == 409
        assert again.json()["error"] == "invalid_state"
    with server.client("producer") as http:
        new_id = http.post("/v1/jobs", json={"task": "whoami"}).json()["job_id"]
    [lease] = leased(server)
    assert lease["job_id"] == new_id


def test_the_role_of_a_kind_is_enforced_by_the_database(
    db_dsn: str,
    tmp_path: Path,
    roles: Roles,  # noqa: F811
    app: pgqueue.App,
) -> None:
    """Producer tokens mapped (by mistake) to a role that may not enqueue:
    the database, not only the server, refuses."""
    nobody = roles.create(db_dsn, "pgq_http_nobody")
    for server in start_server(db_dsn, tmp_path, roles, "--producer-role", nobody.name):
        before = snapshot(db_dsn)
        with server.client("producer") as http:
            answer = http.post("/v1/jobs", json={"task": "t"})
        assert answer.status_code == 403, answer.text
        assert snapshot(db_dsn) == before


def test_token_file_format() -> None:
    digest = hash_token("s3cret")
    tokens = Tokens.parse(f"# comment\n\nworker {digest}  # the worker\nadmin {'a' * 64}\n")
    assert tokens.kind_of("s3cret") == "worker"
    assert tokens.kind_of("S3cret") is None
    assert tokens.kinds == {"worker", "admin"}
    for bad in ("worker", f"boss {digest}", "worker abc", f"worker {digest} extra"):
        with pytest.raises(InvalidOption, match="tokens:1"):
            Tokens.parse(bad)


# --- fencing -------------------------------------------------------------------------------


def test_a_stale_attempt_changes_nothing(server: Server, app: pgqueue.App) -> None:
    job_id = app.enqueue("t", max_attempts=5).job_id
    [first] = leased(server, lease_seconds=1)
    time.sleep(1.2)
    assert app.reap() == 1  # the lease expired: back to queued (after a backoff), attempt 1
    with psycopg.connect(app.dsn, autocommit=True) as conn:  # due now
        conn.execute("UPDATE pgqueue.jobs SET run_at = now() WHERE id = %s", (job_id,))
    [second] = leased(server)
    assert second["job_id"] == job_id
    assert second["attempt_id"] != first["attempt_id"]
    before = snapshot(app.dsn)
    stale = first["attempt_id"]
    with server.client("worker") as http:
        for path, body in (
            ("ack", {"attempt_id": stale, "result": 1}),
            ("fail", {"attempt_id": stale, "error": "boom"}),
            ("nack", {"attempt_id": stale}),
            ("extend", {"attempt_id": stale, "seconds": 60}),
        ):
            answer = http.post(f"/v1/jobs/{job_id}/{path}", json=body)
            assert answer.status_code == 409, (path, answer.text)
            assert answer.json()["error"] == "lease_lost"
        many = http.post("/v1/ack", json={"acks": [{"job_id": job_id, "attempt_id": stale}]})
        assert many.json() == {"acked": [], "lease_lost": [job_id]}
        unknown = http.post("/v1/jobs/424242/ack", json={"attempt_id": stale})
        assert unknown.status_code == 404
        assert unknown.json()["error"] == "job_not_found"
    assert snapshot(app.dsn) == before
    # the current holder still completes it
    with server.client("worker") as http:
        ok = http.post(f"/v1/jobs/{job_id}/ack", json={"attempt_id": second["attempt_id"]})
    assert ok.status_code == 200
    assert app.get_job(job_id).status == "succeeded"


def test_a_lease_token_stays_with_its_holder(server: Server, app: pgqueue.App) -> None:
    """#44: no other token learns a running attempt's id from a read, so a
    second worker cannot complete a job another one leased."""
    job_id = app.enqueue("t", max_attempts=3).job_id
    [held] = leased(server)
    seen: dict[str, Any] = {}
    for kind in ("producer", "worker", "worker-b", "admin"):
        with server.client(kind) as http:
            answer = http.get(f"/v1/jobs/{job_id}", params={"history": "true"})
        assert answer.status_code == 200, answer.text
        [attempt] = answer.json()["attempt_history"]
        assert attempt["finished_at"] is None
        seen[kind] = attempt["attempt_id"]
    assert seen == {
        "producer": None,
        "worker": None,
        "worker-b": None,
        "admin": held["attempt_id"],
    }
    before = snapshot(app.dsn)
    with server.client("worker-b") as http:
        guessed = http.post(f"/v1/jobs/{job_id}/ack", json={"attempt_id": seen["worker-b"]})
        assert guessed.status_code == 422, guessed.text  # null is not an attempt id
        for other in (held["attempt_id"] + 1, held["attempt_id"] + 1000):
            answer = http.post(f"/v1/jobs/{job_id}/ack", json={"attempt_id": other})
            assert answer.status_code == 409, answer.text
    assert snapshot(app.dsn) == before
    assert app.get_job(job_id).status == "running"
    with server.client("worker") as http:
        done = http.post(f"/v1/jobs/{job_id}/ack", json={"attempt_id": held["attempt_id"]})
    assert done.status_code == 200, done.text
    finished = app.get_job(job_id, history=True)
    assert finished.status == "succeeded"
    with server.client("producer") as http:  # a finished attempt fences nothing: shown
        [attempt] = http.get(f"/v1/jobs/{job_id}?history=true").json()["attempt_history"]
    assert attempt["attempt_id"] == held["attempt_id"]


def test_fail_nack_extend_and_requeue(server: Server, app: pgqueue.App) -> None:
    retried = app.enqueue("t", queue="f", max_attempts=3).job_id
    [lease] = leased(server, "f")
    with server.client("worker") as http:
        extended = http.post(
            f"/v1/jobs/{retried}/extend", json={"attempt_id": lease["attempt_id"], "seconds": 600}
        )
        assert extended.status_code == 200, extended.text
        assert extended.json()["extended"] is True
        assert extended.json()["cancel_requested"] is False
        answer = http.post(
            f"/v1/jobs/{retried}/fail",
            json={
                "attempt_id": lease["attempt_id"],
                "error": "flaky",
                "retry_at": "2031-01-01T00:00:00Z",
            },
        )
        assert answer.json() == {"job_id": retried, "status": "scheduled"}
    job = app.get_job(retried)
    assert job.status == "scheduled"
    assert job.attempts == 1
    assert "flaky" in (job.last_error or "")
    assert job.run_at.year == 2031

    released = app.enqueue("t", queue="n").job_id
    [lease] = leased(server, "n")
    with server.client("worker") as http:
        answer = http.post(f"/v1/jobs/{released}/nack", json={"attempt_id": lease["attempt_id"]})
    assert answer.json() == {"job_id": released, "status": "queued"}
    job = app.get_job(released)
    assert job.status == "queued"
    assert job.attempts == 0

    dead = app.enqueue("t", queue="d").job_id
    [lease] = leased(server, "d")
    with server.client("worker") as http:
        answer = http.post(
            f"/v1/jobs/{dead}/fail",
            json={"attempt_id": lease["attempt_id"], "error": "no", "permanent": True},
        )
        assert answer.json() == {"job_id": dead, "status": "dead"}
    with server.client("admin") as http:
        assert http.post(f"/v1/jobs/{released}/requeue").status_code == 409
        assert http.post(f"/v1/jobs/{dead}/requeue").json() == {"job_id": dead, "status": "queued"}
    assert app.get_job(dead).status == "queued"


# --- batches -------------------------------------------------------------------------------


def test_batch_enqueue_is_all_or_nothing(server: Server, app: pgqueue.App) -> None:
    before = snapshot(app.dsn)
    with server.client("producer") as http:
        bad = http.post(
            "/v1/jobs/batch", json={"jobs": [{"task": "a"}, {"task": "b", "priority": "high"}]}
        )
        assert bad.status_code == 422
        assert bad.json()["field"] == "jobs[1].priority"
        # refused by the core behind the schema (a dependency is not a key): nothing either
        deep: dict[str, Any] = {}
        for _ in range(300):
            deep = {"x": deep}
        refused = http.post(
            "/v1/jobs/batch", json={"jobs": [{"task": "a"}, {"task": "b", "payload": deep}]}
        )
        assert refused.status_code == 422, refused.text
        assert snapshot(app.dsn) == before
        good = http.post(
            "/v1/jobs/batch",
            json={
                "jobs": [
                    {"task": "a", "payload": {"n": 1}},
                    {"task": "b", "queue": "other", "dedup_key": "k"},
                    {"task": "b", "queue": "other", "dedup_key": "k"},
                ]
            },
        )
    assert good.status_code == 201, good.text
    ids = good.json()["job_ids"]
    assert good.json()["created"] == [True, True, False]
    assert ids[1] == ids[2]
    assert [app.get_job(i).task for i in ids] == ["a", "b", "b"]
    with server.client("producer") as http:
        hits = http.post("/v1/jobs/batch", json={"jobs": [{"task": "b", "queue": "other",
                                                           "dedup_key": "k"}]})  # fmt: skip
        empty = http.post("/v1/jobs/batch", json={"jobs": []})
    # Nothing created: 200, as for a single enqueue that found its key's job.
    assert (hits.status_code, hits.json()) == (200, {"job_ids": [ids[1]], "created": [False]})
    assert (empty.status_code, empty.json()) == (200, {"job_ids": [], "created": []})


def test_delay_takes_durations_and_tags_meta_depends_on_are_stored(
    server: Server, app: pgqueue.App
) -> None:
    first = app.enqueue("t").job_id
    with server.client("producer") as http:
        answers = [
            http.post("/v1/jobs", json={"task": "t", "delay": delay})
            for delay in ("30s", "1h30m", "PT15M", 45, 2.5)
        ]
        rich = http.post(
            "/v1/jobs",
            json={"task": "t", "tags": ["tenant:9", "nightly"], "meta": {"by": "ops"},
                  "depends_on": [first]},
        )  # fmt: skip
        batch = http.post(
            "/v1/jobs/batch",
            json={"jobs": [{"task": "a", "delay": "2m", "tags": ["x"]},
                           {"task": "b", "meta": {"n": 1}, "depends_on": [first]}]},
        )  # fmt: skip
    assert [a.status_code for a in answers] == [201] * 5, [a.text for a in answers]
    waits = [
        app.get_job(a.json()["job_id"]).run_at - app.get_job(a.json()["job_id"]).created_at
        for a in answers
    ]
    assert [w.total_seconds() for w in waits] == [30, 5400, 900, 45, 2.5]

    assert rich.status_code == 201, rich.text
    job = app.get_job(rich.json()["job_id"])
    assert (job.tags, job.meta, job.status) == (["tenant:9", "nightly"], {"by": "ops"}, "waiting")
    assert batch.status_code == 201, batch.text
    a, b = (app.get_job(i) for i in batch.json()["job_ids"])
    assert (a.run_at - a.created_at).total_seconds() == 120
    assert (a.tags, b.meta, b.status) == (["x"], {"n": 1}, "waiting")
    depends = "SELECT array_agg(depends_on) FROM pgqueue.job_dependencies WHERE job_id = %s"
    assert scalar(app.dsn, depends, (job.id,)) == [first]
    assert scalar(app.dsn, depends, (b.id,)) == [first]


def test_batch_ack_in_one_statement(server: Server, app: pgqueue.App) -> None:
    for n in range(4):
        app.enqueue("t", {"n": n}, queue="b")
    jobs = leased(server, "b", max=4)
    assert len(jobs) == 4
    acks = [{"job_id": j["job_id"], "attempt_id": j["attempt_id"]} for j in jobs[:2]]
    with server.client("worker") as http:
        answer = http.post("/v1/ack", json={"acks": acks})
        assert answer.json() == {"acked": [jobs[0]["job_id"], jobs[1]["job_id"]], "lease_lost": []}
        with_results = [
            {"job_id": jobs[2]["job_id"], "attempt_id": jobs[2]["attempt_id"], "result": [1, 2]},
            {"job_id": jobs[3]["job_id"], "attempt_id": 1 + jobs[3]["attempt_id"] * 1000},
        ]
        answer = http.post("/v1/ack", json={"acks": with_results})
        assert answer.json() == {"acked": [jobs[2]["job_id"]], "lease_lost": [jobs[3]["job_id"]]}
    assert [app.get_job(j["job_id"]).status for j in jobs] == [
        "succeeded",
        "succeeded",
        "succeeded",
        "running",
    ]
    assert app.get_job(jobs[2]["job_id"]).result == [1, 2]


# --- long polls ----------------------------------------------------------------------------


@pytest.fixture
def slow_poll_server(db_dsn: str, tmp_path: Path, roles: Roles) -> Iterator[Server]:  # noqa: F811
    """A server whose waiters look again on their own only every 60 s: a job
    they lease sooner was announced by NOTIFY."""
    yield from start_server(db_dsn, tmp_path, roles, "--poll-interval", "60")


def test_a_long_poll_is_woken_by_an_enqueue(slow_poll_server: Server, app: pgqueue.App) -> None:
    server = slow_poll_server
    got: dict[str, Any] = {}

    def poll() -> None:
        got["jobs"] = leased(server, "lp", wait=15)

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive()  # the empty queue: the request waits
    job_id = app.enqueue("t", queue="lp").job_id
    thread.join(30)
    # Leased within its 15 s wait, while the server looks again on its own
    # only every 60 s: NOTIFY woke it.
    assert [j["job_id"] for j in got["jobs"]] == [job_id]
    assert leased(server, "lp", wait=0.5) == []


def test_sigterm_ends_a_held_long_poll_with_no_jobs(server: Server, app: pgqueue.App) -> None:
    got: dict[str, Any] = {}

    def listeners() -> int:
        return int(
            scalar(
                app.dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'pgqueue-http-listen'",
            )
        )

    def poll() -> None:
        with server.client("worker", timeout=60) as http:
            got["answer"] = http.post("/v1/queues/shut/lease", json={"wait": 20})

    assert listeners() == 0
    thread = threading.Thread(target=poll)
    thread.start()
    # The first waiter starts the server's LISTEN session: the poll is held.
    wait_until(listeners, 30, "the long poll to wait")
    server.process.send_signal(signal.SIGTERM)
    thread.join(60)
    assert not thread.is_alive()
    server.process.wait(60)
    answer = got["answer"]
    # Uvicorn cancelled it after 5 s: a plain-text 500 and a logged traceback.
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"jobs": []}
    log = server.log.read_text()
    assert "ERROR" not in log, log
    assert "Traceback" not in log, log


def test_the_server_listens_only_while_a_long_poll_waits(server: Server, app: pgqueue.App) -> None:
    """#44: an idle server holds no LISTEN session, so enqueues made anywhere
    in the schema cost it nothing; a long poll opens one, which closes a few
    seconds after the last long poll ended."""

    def listening() -> int:
        return int(
            scalar(
                app.dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'pgqueue-http-listen'",
            )
        )

    leased(server, "idle")  # the server is up and has served a lease (no wait)
    app.enqueue_many([pgqueue.JobSpec("t", {"n": n}, "elsewhere") for n in range(50)])
    assert listening() == 0
    got: dict[str, Any] = {}

    def poll() -> None:
        with server.client("worker", timeout=60) as http:
            got["answer"] = http.post("/v1/queues/idle/lease", json={"wait": 20})

    thread = threading.Thread(target=poll)
    thread.start()
    wait_until(lambda: listening() == 1, 30, "the long poll to LISTEN")
    job_id = app.enqueue("t", queue="idle").job_id
    thread.join(30)
    assert [j["job_id"] for j in got["answer"].json()["jobs"]] == [job_id]
    wait_until(lambda: listening() == 0, 30, "the LISTEN session to close after the last poll")


def test_hundreds_of_waiters_share_one_listener(server: Server, app: pgqueue.App) -> None:
    waiters = 200

    async def main() -> list[list[dict[str, Any]]]:
        async with server.async_client("worker", timeout=60) as http:

            async def one(n: int) -> list[dict[str, Any]]:
                answer = await http.post(
                    "/v1/queues/many/lease", json={"worker_id": f"w{n}", "wait": 20}
                )
                assert answer.status_code == 200, answer.text
                jobs: list[dict[str, Any]] = answer.json()["jobs"]
                return jobs

            tasks = [asyncio.create_task(one(n)) for n in range(waiters)]
            await asyncio.sleep(3)  # all waiting now
            sessions = scalar(
                app.dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'pgqueue%%' AND pid <> pg_backend_pid()",
            )
            assert sessions <= 12, sessions  # the pool (10 at most) and one LISTEN session
            await asyncio.to_thread(
                app.enqueue_many, [pgqueue.JobSpec("t", {"n": n}, "many") for n in range(waiters)]
            )
            return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    leased_ids = [j["job_id"] for jobs in results for j in jobs]
    assert len(leased_ids) == waiters
    assert len(set(leased_ids)) == waiters


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"task": NaN}', 400, None),
        (b"", 400, None),
        (b'{"task": "t", "colour": 1}', 422, "colour"),
        (b'{"payload": {}}', 422, "task"),
        (b'{"task": ""}', 422, "task"),
        (b'{"task": "a\\u0000b"}', 422, "task"),
        (b'{"task": "t", "payload": [1]}', 422, "payload"),
        (b'{"task": "t", "priority": 1.5}', 422, "priority"),
        (b'{"task": "t", "priority": 99999}', 422, "priority"),
        (b'{"task": "t", "priority": true}', 422, "priority"),
        (b'{"task": "t", "queue": "no spaces"}', 422, "queue"),
        (b'{"task": "t", "run_at": "tomorrow"}', 422, "run_at"),
        (b'{"task": "t", "run_at": "2030-02-30T00:00:00Z"}', 422, "run_at"),
        (b'{"task": "t", "delay": -1}', 422, "delay"),
        (b'{"task": "t", "delay": "30"}', 422, "delay"),  # a unit is needed
        (b'{"task": "t", "delay": "soon"}', 422, "delay"),
        (b'{"task": "t", "delay": "-5s"}', 422, "delay"),
        (b'{"task": "t", "delay": " 30s"}', 422, "delay"),
        (b'{"task": "t", "delay": "99999d"}', 422, "delay"),  # over 36500 days
        (b'{"task": "t", "delay": "P"}', 422, "delay"),
        (b'{"task": "t", "delay": true}', 422, "delay"),
        (b'{"task": "t", "delay": "5s", "run_at": "2030-01-01T00:00:00Z"}', 422, "delay"),
        (b'{"task": "t", "delay": 5, "run_at": "2030-01-01T00:00:00Z"}', 422, "delay"),
        (b'{"task": "t", "max_attempts": -1}', 422, "max_attempts"),
        (b'{"task": "t", "dedup_key": ""}', 422, "dedup_key"),
        (b'{"task": "t", "tags": ["bad tag"]}', 422, "tags"),
        (b'{"task": "t", "tags": "x"}', 422, "tags"),
        (b'{"task": "t", "meta": 3}', 422, "meta"),
        (b'{"task": "t", "depends_on": ["x"]}', 422, "depends_on"),
        (b'{"task": "\\ud800"}', 422, "task"),
    ],
)
def test_bad_enqueue_bodies(
    server: Server, app: pgqueue.App, body: bytes, status: int, field: str | None
) -> None:
    before = snapshot(app.dsn)
    with server.client("producer") as http:
        answer = http.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    assert set(answer.json()) >= {"error", "message"}
    # tags[0]: the element at fault
    assert (answer.json().get("field") or "").startswith(field or "")
    assert (field is None) == ("field" not in answer.json())
    if field:
        assert field in answer.json()["message"]
    assert snapshot(app.dsn) == before


def test_oversize_bodies_and_odd_paths(server: Server, app: pgqueue.App) -> None:
    before = snapshot(app.dsn)
    big = b'{"task": "t", "payload": {"x": "' + b"a" * (1 << 20) + b'"}}'
    with server.client("producer") as http:
        answer = http.post("/v1/jobs", content=big)
        assert answer.status_code == 413
        assert answer.json()["error"] == "too_large"

        def chunks() -> Iterator[bytes]:  # no content-length: counted while read
            yield b'{"task": "t", "payload": {"x": "'
            for _ in range(40):
                yield b"a" * 32768
            yield b'"}}'

        assert http.post("/v1/jobs", content=chunks()).status_code == 413
        assert http.get("/v1/jobs/abc").status_code == 422
        assert http.get("/v1/jobs/99999999999999999999").status_code == 422
        assert http.get("/v1/jobs/0").json()["field"] == "id"
        assert http.get("/v1/queues/bad%20name/metrics").json()["field"] == "queue"
        assert http.get("/v1/nowhere").json()["error"] == "not_found"
        wrong = http.get("/v1/jobs/batch/x")
        assert wrong.status_code == 404
        assert http.delete("/v1/jobs").status_code == 405
    with server.client("worker") as http:
        for path, body in (
            ("/v1/queues/q/lease", {"max": 0}),
            ("/v1/queues/q/lease", {"wait": 21}),
            ("/v1/queues/q/lease", {"worker_id": "a\nb"}),
            ("/v1/jobs/1/ack", {}),
            ("/v1/jobs/1/fail", {"attempt_id": 1}),
            ("/v1/jobs/1/extend", {"attempt_id": 1, "seconds": 0}),
            ("/v1/ack", {"acks": []}),
            ("/v1/ack", {"acks": [{"job_id": 1}]}),
        ):
            answer = http.post(path, json=body)
            assert answer.status_code == 422, (path, body, answer.text)
            assert answer.json()["field"]
    assert snapshot(app.dsn) == before


def test_openapi_document(server: Server) -> None:
    with server.client() as http:
        document = http.get("/v1/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == {
        "/v1/jobs",
        "/v1/jobs/batch",
        "/v1/jobs/{id}",
        "/v1/jobs/{id}/cancel",
        "/v1/jobs/{id}/requeue",
        "/v1/jobs/{id}/ack",
        "/v1/jobs/{id}/fail",
        "/v1/jobs/{id}/nack",
        "/v1/jobs/{id}/extend",
        "/v1/ack",
        "/v1/queues/{queue}/lease",
        "/v1/queues/{queue}/metrics",
        "/v1/events/{key}",
        "/v1/openapi.json",
    }
    enqueue = document["components"]["schemas"]["EnqueueRequest"]
    assert enqueue["required"] == ["task"]
    assert enqueue["additionalProperties"] is False
    delay = enqueue["properties"]["delay"]["anyOf"][0]["anyOf"]  # a duration, or null
    assert [one["type"] for one in delay] == ["number", "string"]
    for path in ("/v1/jobs", "/v1/jobs/batch"):
        assert {"200", "201"} <= set(document["paths"][path]["post"]["responses"])


def test_terminated_backends_answer_503_then_recover(server: Server, app: pgqueue.App) -> None:
    """#44: the server's sessions (a pool per kind) killed under it: answers
    are 201 or a JSON 503 to retry, never a 500, and every job created is stored."""
    created: list[int] = []
    with server.client("producer") as http:
        for n in range(5):
            created.append(
                http.post("/v1/jobs", json={"task": "t", "payload": {"n": n}}).json()["job_id"]
            )
        killed = scalar(
            app.dsn,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'pgqueue-http'",
        )
        assert killed >= 1
        statuses = []
        for n in range(5, 25):
            answer = http.post("/v1/jobs", json={"task": "t", "payload": {"n": n}})
            statuses.append(answer.status_code)
            assert answer.status_code in (201, 503), answer.text
            if answer.status_code == 503:
                assert answer.json()["error"] == "unavailable"
            else:
                created.append(answer.json()["job_id"])
        assert statuses[-5:] == [201] * 5  # recovered
    assert app.metrics()["default"].queued == len(created)
    log = server.log.read_text()
    assert "Traceback" not in log, log[-2000:]
