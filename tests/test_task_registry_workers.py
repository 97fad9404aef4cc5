"""Task registry with real worker processes: per-task limits across three
workers (#18.1), live settings changed while a worker runs (#18.2), a worker
without a task does not dead-letter its jobs (#13.7), routing over two
schemas (#18.6), and `pgqueue tasks` / `task` / `workers` (#13.18, #13.5)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest

import pgqueue
from examples.router import SCHEMAS as ROUTER_SCHEMAS
from examples.router import build_router
from tests.cli_support import invoke, run_json
from tests.fixtures.workers import Workers, task_events, wait_until

REGISTRY_APP = "tests.apps.registry:app"


def running_of(dsn: str, task: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue.jobs WHERE task = %s AND status = 'running'", (task,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_task_limit_holds_across_three_workers_while_other_tasks_drain(
    workers: Workers, app: pgqueue.App, db_dsn: str
) -> None:
    app.set_task_limit("reg_hold", concurrency=2)
    started = [workers.spawn("--concurrency", "4", app=REGISTRY_APP) for _ in range(3)]
    for worker in started:
        worker.wait_registered()

    limited = [app.enqueue("reg_hold", {"seconds": 0.4}).job_id for _ in range(8)]
    others = [app.enqueue("reg_hold_other", {"seconds": 0.05}).job_id for _ in range(24)]
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(running_of(db_dsn, "reg_hold"))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        workers.wait_statuses(limited + others, ["succeeded"])
    finally:
        done.set()
        sampler.join()

    assert max(samples) <= 2, f"more than 2 reg_hold jobs running at once: {max(samples)}"
    assert max(samples) >= 1
    # The same from the tasks' own start/end times (one database clock).
    events = sorted(
        (e["at"], 1 if e["kind"] == "start" else -1) for e in task_events(db_dsn, key="reg_hold")
    )
    level, peak = 0, 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak <= 2
    # The unlimited task was not held back: all of it ended before the limited
    # task's last job could start (it needs 4 rounds of 2).
    other_ends = [e["at"] for e in task_events(db_dsn, "end", "reg_hold_other")]
    limited_starts = [e["at"] for e in task_events(db_dsn, "start", "reg_hold")]
    assert len(other_ends) == 24
    assert max(other_ends) < max(limited_starts)
    assert "task 'reg_hold'" in app.explain(limited[0]) or app.get_job(limited[0]).status == (
        "succeeded"
    )


def test_worker_without_the_task_does_not_dead_letter_while_another_has_it(
    workers: Workers, app: pgqueue.App
) -> None:
    # Grace 0: the old worker would dead-letter at once if it went by age alone.
    old = workers.spawn(
        "--concurrency",
        "4",
        "--unknown-task-grace",
        "0s",
        app="tests.apps.registry:app_without_mail",
    )
    new = workers.spawn("--concurrency", "1", app=REGISTRY_APP)
    old.wait_registered()
    new.wait_registered()
    jobs = [app.enqueue("reg_mail", {"to": f"{i}@b.c"}, queue="default").job_id for i in range(12)]
    statuses = workers.wait_statuses(jobs, ["succeeded", "dead"])
    assert set(statuses.values()) == {"succeeded"}, statuses
    released = 0
    for job_id in jobs:
        job = app.get_job(job_id, history=True)
        assert job.attempts == 1  # handing back did not count
        released += sum(a.outcome == "released" for a in job.attempt_history)
    # The old worker did lease some of them (it has 4 free slots, the new one 1).
    assert released > 0


def test_worker_without_the_task_waits_within_the_grace_period(
    workers: Workers, app: pgqueue.App
) -> None:
    old = workers.spawn("--concurrency", "2", app="tests.apps.registry:app_without_mail")
    old.wait_registered()
    job_id = app.enqueue("reg_mail", {"to": "a@b.c"}, queue="default").job_id

    def released() -> pgqueue.Job | None:
        # Between hand-backs the old worker leases it again (briefly running).
        job = app.get_job(job_id, history=True)
        handed_back = any(a.outcome == "released" for a in job.attempt_history)
        return job if handed_back and job.status in ("queued", "scheduled") else None

    job = wait_until(released, 30.0, "the old worker to hand the job back", [old])
    assert job.attempts == 0
    assert {a.outcome for a in job.attempt_history or []} == {"released"}

    def explained() -> str | None:
        text = app.explain(job_id)
        return text if "no live worker knows task 'reg_mail'" in text else None

    wait_until(explained, 30.0, "explain to say why the job waits", [old])
    assert [u.task for u in app.unknown_tasks()] == ["reg_mail"]
    assert app.get_job(job_id).status != "dead"

    workers.spawn("--concurrency", "2", app=REGISTRY_APP).wait_registered()
    assert workers.wait_statuses([job_id], ["succeeded", "dead"])[job_id] == "succeeded"


def test_live_settings_change_while_a_worker_runs(workers: Workers, app: pgqueue.App) -> None:
    worker = workers.spawn("--concurrency", "2", app=REGISTRY_APP)
    worker.wait_registered()
    # Once a job ran, the worker is past its start-up (listening for changes).
    first = app.enqueue("reg_slow", {"seconds": 0.1}).job_id
    assert workers.wait_statuses([first], ["dead", "succeeded"])[first] == "succeeded"
    app.set_task_options("reg_slow", timeout=0.3, max_attempts=1)
    slow = app.enqueue("reg_slow", {"seconds": 3}).job_id
    assert workers.wait_statuses([slow], ["dead", "succeeded"])[slow] == "dead"
    outcomes = [a.outcome for a in app.get_job(slow, history=True).attempt_history]
    assert outcomes == ["timeout"]

    app.set_task_options("reg_slow", unset=["timeout", "max_attempts"])
    quick = app.enqueue("reg_slow", {"seconds": 0.5}).job_id
    assert workers.wait_statuses([quick], ["dead", "succeeded"])[quick] == "succeeded"


def test_jobs_enqueued_by_name_get_the_workers_lease(workers: Workers, app: pgqueue.App) -> None:
    # Nobody published reg_mail yet: the job is stored with the default lease,
    # and the worker that knows the task applies its 120 s lease.
    job_id = app.enqueue("reg_mail", {"to": "x"}, queue="mail").job_id
    assert app.get_job(job_id).queue == "mail"
    worker = workers.spawn("--concurrency", "1", app=REGISTRY_APP)
    worker.wait_registered()
    workers.wait_statuses([job_id], ["succeeded"])
    info = app.get_task("reg_mail")
    assert (info.queue, info.max_attempts, info.lease_seconds) == ("mail", 2, 120)
    assert info.workers == [worker.wait_registered()["id"]]
    later = app.enqueue("reg_mail", {"to": "y"}).job_id
    assert app.get_job(later).queue == "mail"
    assert workers.wait_statuses([later], ["succeeded"])[later] == "succeeded"


def test_router_example_routes_by_shard_key_and_one_worker_serves_both_schemas(
    workers: Workers, db_dsn: str
) -> None:
    """The worked example (examples/router.py): two schemas, one worker process."""
    for schema in ROUTER_SCHEMAS:
        pgqueue.App(db_dsn, schema=schema).migrate()
    with build_router(db_dsn) as router:
        invoice = router.tasks["send_invoice"]
        placed: dict[str, list[int]] = {key: [] for key in ROUTER_SCHEMAS}
        for i in range(20):
            key, result = invoice.with_options(shard_key=f"customer:{i}").enqueue(
                customer_id=i, amount_cents=i
            )
            assert key == router.key_for("send_invoice", shard_key=f"customer:{i}")
            assert key == router.key_for("x", shard_key=f"customer:{i}")  # by key only
            placed[key].append(result.job_id)
        key, extra = router.enqueue(
            "send_invoice", {"customer_id": 99, "amount_cents": 1}, shard_key="customer:99"
        )
        placed[key].append(extra.job_id)
        assert all(placed.values()), placed  # both shards got jobs
        with pytest.raises(pgqueue.InvalidOption, match="shard_key"):
            router.enqueue("send_invoice", {"customer_id": 1, "amount_cents": 1})
        with pytest.raises(pgqueue.InvalidName, match="no App named"):
            router.get_job("nowhere", 1)

        worker = workers.spawn("--concurrency", "4", app="examples.router:router")

        def all_done() -> bool | None:
            for key, ids in placed.items():
                for job_id in ids:
                    if router.get_job(key, job_id).status != "succeeded":
                        return None
            return True

        wait_until(all_done, 60.0, "every routed job to succeed on its shard", [worker])
        for key, ids in placed.items():
            for job_id in ids:
                job = router.get_job(key, job_id)
                assert job.queue == "billing"
                assert job.result == job.payload
            with psycopg.connect(db_dsn) as conn:
                count = conn.execute(f'SELECT count(*) FROM "{key}".jobs').fetchone()
            assert count is not None
            assert count[0] == len(ids)  # nothing landed on the other shard


def test_router_with_a_route_function() -> None:
    apps = {
        "us": pgqueue.App("postgresql:///unused", schema="a"),
        "eu": pgqueue.App("postgresql:///unused", schema="b"),
    }
    router = pgqueue.Router(apps, route=lambda task, payload: payload["region"])
    assert router.key_for("t", {"region": "eu"}) == "eu"
    with pytest.raises(pgqueue.InvalidName, match="not one of"):
        router.key_for("t", {"region": "mars"})
    with pytest.raises(pgqueue.InvalidOption, match="without route"):
        router.key_for("t", {"region": "eu"}, shard_key="k")
    with pytest.raises(pgqueue.InvalidOption):
        pgqueue.Router({})
    assert pgqueue.router.shard_index("customer:1", 2) == pgqueue.router.shard_index(
        "customer:1", 2
    )


def test_cli_tasks_task_and_workers_commands(
    workers: Workers, app: pgqueue.App, db_dsn: str
) -> None:
    worker = workers.spawn("--concurrency", "1", app=REGISTRY_APP)
    worker_id = worker.wait_registered()["id"]

    def cli(*args: str, ok: bool = True) -> Any:
        done = invoke(db_dsn, *args)
        assert (done.exit_code == 0) == ok, done.stderr
        return done

    listed = run_json(db_dsn, "tasks")  # the installed command, once
    mail = next(t for t in listed if t["name"] == "reg_mail")
    assert mail["queue"] == "mail"
    assert mail["workers"] == [worker_id]
    assert json.loads(cli("tasks", "--app", "tests.apps.tasks:app", "--json").stdout)
    cli("task", "set", "reg_mail", "--timeout", "30s", "--max-attempts", "0")
    shown: dict[str, Any] = json.loads(cli("task", "show", "reg_mail", "--json").stdout)
    assert shown["settings"]["timeout"] == 30.0
    assert shown["settings"]["max_attempts"] == 0
    cli("task", "limit", "reg_mail", "--concurrency", "3")
    assert app.get_task("reg_mail").settings.concurrency == 3
    cli("task", "limit", "reg_mail", "--clear")
    assert app.get_task("reg_mail").settings.concurrency is None
    assert "reg_mail" in cli("task", "list").stdout
    bad = cli("task", "set", "reg_mail", "--max-attempts", "-2", ok=False)
    assert "max_attempts" in bad.stderr
    cli("task", "stats", "--json")
    states = json.loads(cli("workers", "list", "--json").stdout)
    assert [(w["id"], w["state"]) for w in states] == [(worker_id, "alive")]
    refused = cli("workers", "forget", worker_id, ok=False)
    assert "alive" in refused.stderr
