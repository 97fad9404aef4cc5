"""Prometheus metrics: a real worker's ``/metrics`` (names, labels, counts
equal to the jobs it ran) and the database view of ``pgqueue metrics``."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgqueue
from pgqueue.worker.settings import WorkerSettings
from tests.fixtures.factory import JobFactory
from tests.fixtures.workers import Workers, pgqueue_command, subprocess_env, wait_until


def scrape(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(families: dict[str, Any], family: str, sample: str) -> dict[tuple[Any, ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in families[family].samples
        if s.name == sample
    }


def test_worker_serves_metrics_matching_the_jobs_it_ran(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn("--no-scheduler", "--metrics-port", "0", "--metrics-host", "127.0.0.1")
    registration = worker.wait_registered()
    port = int(worker.wait_logged("serving metrics")["port"])
    ok = [tasks_app.enqueue("echo", {"value": i}).job_id for i in range(5)]
    dead = [tasks_app.enqueue("give_up", {"message": "no"}).job_id for _ in range(2)]
    workers.wait_statuses(ok + dead)

    def scraped() -> dict[str, Any] | None:
        families = scrape(port)
        done = samples(families, "pgqueue_jobs_completed", "pgqueue_jobs_completed_total")
        return families if sum(done.values()) >= 7 else None

    families = wait_until(scraped, 30.0, "the counters to reach 7 jobs", [worker])
    completed = samples(families, "pgqueue_jobs_completed", "pgqueue_jobs_completed_total")
    assert completed == {
        (("outcome", "succeeded"), ("queue", "default"), ("task", "echo")): 5.0,
        (("outcome", "failed"), ("queue", "default"), ("task", "give_up")): 2.0,
    }
    durations = samples(
        families, "pgqueue_job_duration_seconds", "pgqueue_job_duration_seconds_count"
    )
    assert durations[(("queue", "default"), ("task", "echo"))] == 5.0
    assert durations[(("queue", "default"), ("task", "give_up"))] == 2.0
    waits = samples(families, "pgqueue_job_wait_seconds", "pgqueue_job_wait_seconds_count")
    assert waits == {(("queue", "default"),): 7.0}
    inf = samples(families, "pgqueue_job_wait_seconds", "pgqueue_job_wait_seconds_bucket")
    assert inf[(("le", "+Inf"), ("queue", "default"))] == 7.0
    running = samples(families, "pgqueue_jobs_running", "pgqueue_jobs_running")
    assert running == {(("queue", "default"),): 0.0}
    info = samples(families, "pgqueue_worker_info", "pgqueue_worker_info")
    assert info == {
        (("version", pgqueue.__version__), ("worker_id", registration["id"])): 1.0,
    }
    assert "pgqueue_database_errors" in families
    pool = samples(families, "pgqueue_worker_pool_info", "pgqueue_worker_pool_info")
    assert pool == {(("pool", "thread"),): 1.0}
    assert "pgqueue_worker_children" not in families  # only with --pool process


def test_metrics_port_is_validated() -> None:
    with pytest.raises(pgqueue.InvalidOption, match="metrics_port"):
        WorkerSettings.build(metrics_port=70000)
    with pytest.raises(pgqueue.InvalidOption, match="metrics_port"):
        WorkerSettings.build(metrics_port="9100")  # type: ignore[arg-type]


def test_database_view(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_factory.insert_many(4, queue="mail", status="queued")
    job_factory.insert(queue="mail", status="queued", run_at=-120.0)
    job_factory.insert(queue="mail", status="scheduled", run_at=3600.0)
    job_factory.insert(queue="mail", status="scheduled", run_at=-5.0)  # due: counts as queued
    job_factory.insert(queue="mail", status="running")
    job_factory.insert_many(3, queue="reports", status="dead", finished=True)
    job_factory.insert(queue="reports", status="succeeded")
    job_factory.insert(queue="reports", status="cancelled")
    app.pause_queue("reports")
    view = app.queue_view()
    by_queue = {q.queue: q for q in view.queues}
    assert by_queue["mail"].jobs == {
        "queued": 6, "scheduled": 1, "running": 1, "succeeded": 0, "dead": 0, "cancelled": 0,
    }  # fmt: skip
    assert by_queue["reports"].jobs == {
        "queued": 0, "scheduled": 0, "running": 0, "succeeded": 1, "dead": 3, "cancelled": 1,
    }  # fmt: skip
    assert by_queue["mail"].oldest_ready_age_seconds >= 120
    assert by_queue["reports"].oldest_ready_age_seconds is None
    assert by_queue["reports"].paused
    assert not by_queue["mail"].paused
    assert view.workers_alive == 0

    families = {f.name: f for f in text_string_to_metric_families(app.metrics_text())}
    jobs = samples(families, "pgqueue_queue_jobs", "pgqueue_queue_jobs")
    assert jobs[(("queue", "mail"), ("status", "queued"))] == 6
    assert jobs[(("queue", "reports"), ("status", "dead"))] == 3
    assert len(jobs) == 12  # every status of every queue, zeros included
    paused = samples(families, "pgqueue_queue_paused", "pgqueue_queue_paused")
    assert paused == {(("queue", "mail"),): 0, (("queue", "reports"),): 1}
    age = samples(
        families,
        "pgqueue_queue_oldest_ready_age_seconds",
        "pgqueue_queue_oldest_ready_age_seconds",
    )
    assert age[(("queue", "mail"),)] >= 120
    assert families["pgqueue_workers_alive"].samples[0].value == 0


def test_counts_past_the_cap_are_estimated(app: pgqueue.App, job_factory: JobFactory) -> None:
    job_factory.insert_many(50, queue="big", status="dead", finished=True)
    job_factory.insert_many(30, queue="big", status="queued")
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute("ANALYZE pgqueue.jobs")
    view = app.queue_view(cap=10)
    big = {q.queue: q for q in view.queues}["big"]
    assert big.jobs["dead"] == 50  # the planner's estimate (exact after ANALYZE here)
    assert "dead" in big.estimated
    assert big.jobs["queued"] == 30
    assert "queued" in big.estimated
    exact = {q.queue: q for q in app.queue_view(cap=1000).queues}["big"]
    assert exact.estimated == []
    assert exact.jobs["dead"] == 50


def test_cli_metrics(app: pgqueue.App, job_factory: JobFactory, db_dsn: str) -> None:
    job_factory.insert(queue="cli", status="queued")

    def run(*args: str) -> str:
        result = subprocess.run(
            [*pgqueue_command(), "metrics", *args],
            env=subprocess_env(db_dsn),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    text = run()
    assert 'pgqueue_queue_jobs{queue="cli",status="queued"} 1' in text
    assert "# TYPE pgqueue_workers_alive gauge" in text
    data = json.loads(run("--json"))
    assert data["workers_alive"] == 0
    assert data["queues"][0]["queue"] == "cli"
    assert data["queues"][0]["jobs"]["queued"] == 1


def test_queue_metrics_counts_stop_at_the_cap(app: pgqueue.App, job_factory: JobFactory) -> None:
    """app.metrics() / pgqueue status: a queue's queued count stops at the
    cap; a status past it is the planner's estimate shared out by queue."""
    from pgqueue.ops import inspect

    job_factory.insert_many(50, queue="big", status="dead", finished=True)
    job_factory.insert_many(30, queue="big", status="queued")
    job_factory.insert_many(2, queue="small", status="dead", finished=True)
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute("ANALYZE pgqueue.jobs")
    exact = app.metrics()
    assert (exact["big"].queued, exact["big"].dead, exact["small"].dead) == (30, 50, 2)
    capped = app._database.run(inspect.metrics(cap=10))
    assert capped["big"].queued == 10
    # The newest 10 dead jobs are shared out to the 52 the statistics count.
    assert capped["big"].dead + capped["small"].dead == pytest.approx(52, abs=6)
    assert capped["big"].dead > 10
