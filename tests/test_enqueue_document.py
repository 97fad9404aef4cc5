"""The document enqueue_batch takes: its object form carries a hint (whether
any job has a dedup key) that may be wrong without harm, and queues are
registered from the rows actually inserted, whatever the caller claims."""

from __future__ import annotations

import json

import psycopg
import pytest

import pgqueue
from pgqueue import JobStatus
from tests.fixtures.workers import Workers


def enqueue_batch(conn: psycopg.Connection[object], doc: object) -> list[tuple[int, bool]]:
    rows = conn.execute(
        "SELECT job_id, created FROM pgqueue.enqueue_batch(%s::jsonb)", (json.dumps(doc),)
    ).fetchall()
    conn.commit()
    return [(int(r[0]), bool(r[1])) for r in rows]  # type: ignore[call-overload]


def test_queues_are_registered_from_inserted_rows(conn: psycopg.Connection[object]) -> None:
    doc = {"dedup": False, "jobs": [{"task": "t", "queue": "fresh"}, {"task": "t"}]}
    enqueue_batch(conn, doc)
    names = {r[0] for r in conn.execute("SELECT name FROM pgqueue.queues").fetchall()}
    assert {"fresh", "default"} <= names


def test_a_false_dedup_hint_cannot_skip_dedup(
    conn: psycopg.Connection[object], app: pgqueue.App
) -> None:
    first = app.enqueue("t", dedup_key="k")
    doc = {"dedup": False, "jobs": [{"task": "t", "dedup_key": "k"}]}
    with pytest.raises(psycopg.errors.UniqueViolation):
        enqueue_batch(conn, doc)
    conn.rollback()
    live = conn.execute(
        "SELECT id FROM pgqueue.jobs WHERE dedup_key = 'k'"
        " AND status IN ('queued', 'scheduled', 'running')"
    ).fetchall()
    assert [r[0] for r in live] == [first.job_id]


def test_the_plain_array_form_still_works(conn: psycopg.Connection[object]) -> None:
    ids = enqueue_batch(
        conn, [{"task": "a"}, {"task": "b", "dedup_key": "x"}, {"task": "c", "dedup_key": "x"}]
    )
    assert [created for _, created in ids] == [True, True, False]
    assert ids[1][0] == ids[2][0]


def test_a_worker_dead_letters_a_payload_too_deep_to_decode(
    workers: Workers, tasks_app: pgqueue.App, conn: psycopg.Connection[object]
) -> None:
    # Got in around the enqueue checks (e.g. stored by an older version).
    deep = "[" * 3000 + "]" * 3000
    job_id = conn.execute(
        "INSERT INTO pgqueue.jobs (id, task, payload, queue, run_at, status) "
        "VALUES (nextval('pgqueue.jobs_id_seq'), 'echo', jsonb_build_object('value', %s::jsonb), "
        "'default', now(), 'queued') RETURNING id",
        (deep,),
    ).fetchone()[0]  # type: ignore[index]
    ok_id = conn.execute("SELECT pgqueue.enqueue('echo', '{\"value\": 1}')").fetchone()[0]  # type: ignore[index]
    conn.commit()
    workers.spawn().wait_registered()
    jobs = workers.wait_finished(tasks_app, [job_id, ok_id])
    assert jobs[job_id].status is JobStatus.DEAD
    assert jobs[job_id].attempt_history is not None
    assert jobs[job_id].attempt_history[-1].error_code == "invalid_payload"
    assert jobs[ok_id].status is JobStatus.SUCCEEDED
