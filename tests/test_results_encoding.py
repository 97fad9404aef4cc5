"""Return values that are not plain JSON: common types are
stored with a documented encoding; anything else is reported on the job, in
the worker's log and by ``result()``, never silently turned into None."""

from __future__ import annotations

import dataclasses
import enum
import textwrap
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

import pgqueue
from pgqueue.payloads import UnstoredResult, encode_result
from tests.fixtures.workers import Workers

TASKS = """
import uuid
from datetime import UTC, datetime
import pgqueue

app = pgqueue.App(max_result_bytes=1000)

@app.task
def when() -> object:
    return {"at": datetime(2026, 12, 24, 18, tzinfo=UTC), "tags": {"b", "a"},
            "id": uuid.UUID(int=7)}

@app.task
def opaque() -> object:
    return object()

@app.task
def huge() -> object:
    return "x" * 5000

@app.task
def nothing() -> None:
    return None
"""


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


def test_documented_encoding() -> None:
    value = {
        "dt": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "d": date(2026, 1, 2),
        "td": timedelta(minutes=2),
        "u": uuid.UUID(int=1),
        "dec": Decimal("1.50"),
        "s": {3, 1, 2},
        "t": (1, "a"),
        "e": Colour.RED,
        "p": Point(1, 2),
        "path": Path("/tmp/x"),
    }
    assert encode_result(value, 10_000) == (
        '{"dt":"2026-01-02T03:04:05+00:00","d":"2026-01-02","td":120.0,'
        '"u":"00000000-0000-0000-0000-000000000001","dec":"1.50","s":[1,2,3],'
        '"t":[1,"a"],"e":"red","p":{"x":1,"y":2},"path":"/tmp/x"}'
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (object(), "not JSON-serialisable (a object is not JSON-serialisable)"),
        (b"bytes", "not JSON-serialisable"),
        (float("nan"), "not JSON-serialisable"),
        ("x" * 50, "over the 20-byte result limit"),
    ],
)
def test_what_cannot_be_stored_says_why(value: object, reason: str) -> None:
    encoded = encode_result(value, 20)
    assert isinstance(encoded, UnstoredResult)
    assert reason in encoded


def test_ack_refuses_a_result_it_cannot_store(app: pgqueue.App) -> None:
    job = app.enqueue("t")
    leased = app.lease("default", "w1")[0]
    with pytest.raises(pgqueue.InvalidPayload, match="cannot store the result: the value is"):
        app.ack(leased, object())
    assert app.get_job(job.job_id).status is pgqueue.JobStatus.RUNNING
    app.ack(leased, {"at": datetime(2026, 1, 1, tzinfo=UTC)})
    assert app.result(job.job_id, timeout=5) == {"at": "2026-01-01T00:00:00+00:00"}


def test_worker_reports_results_it_cannot_store(
    workers: Workers, db_dsn: str, tmp_path: Path
) -> None:
    module = tmp_path / "result_tasks.py"
    module.write_text(textwrap.dedent(TASKS))
    with pgqueue.App(db_dsn) as app:
        ids = {name: app.enqueue(name).job_id for name in ("when", "opaque", "huge", "nothing")}
        worker = workers.spawn("--concurrency", "4", app=f"{module}:app")
        workers.wait_finished(app, list(ids.values()))
        assert app.result(ids["when"], timeout=5) == {
            "at": "2026-12-24T18:00:00+00:00",
            "tags": ["a", "b"],
            "id": "00000000-0000-0000-0000-000000000007",
        }
        assert app.result(ids["nothing"], timeout=5) is None
        with pytest.raises(pgqueue.ResultNotStored, match="not JSON-serialisable"):
            app.result(ids["opaque"], timeout=5)
        with pytest.raises(pgqueue.ResultNotStored, match="over the 1000-byte result limit"):
            app.result(ids["huge"], timeout=5)
        opaque = app.get_job(ids["opaque"])
        assert opaque.status is pgqueue.JobStatus.SUCCEEDED
        assert opaque.result is None
        assert (opaque.last_error or "").startswith("result not stored: the value is not JSON")
    warnings = worker.logged("result was not stored")
    assert sorted(w["job_id"] for w in warnings) == sorted([ids["opaque"], ids["huge"]])
    assert all(w["task"] in ("opaque", "huge") and w["reason"] for w in warnings)


FAILING = """
import pgqueue

app = pgqueue.App()

@app.task(max_attempts=2, retry=pgqueue.Backoff(base=0, jitter=0))
def boom() -> None:
    raise ValueError("no")

@app.task
def refuse() -> None:
    raise pgqueue.Permanent("bad input")
"""


def test_worker_says_when_a_job_is_dead(workers: Workers, db_dsn: str, tmp_path: Path) -> None:
    module = tmp_path / "failing_tasks.py"
    module.write_text(textwrap.dedent(FAILING))
    with pgqueue.App(db_dsn) as app:
        boom = app.enqueue("boom", max_attempts=2).job_id  # by name: state the attempts
        refuse = app.enqueue("refuse").job_id
        worker = workers.spawn(app=f"{module}:app")
        workers.wait_finished(app, [boom, refuse])
    worker.wait_logged("job is dead", timeout=30)
    dead = {line["job_id"]: line for line in worker.logged("job is dead")}
    assert dead[boom]["event"] == "job is dead: no attempts left"
    assert (dead[boom]["task"], dead[boom]["attempt"]) == ("boom", 2)
    assert dead[refuse]["event"] == "job is dead: permanent failure"
    assert len(worker.logged("job failed")) == 3  # two attempts of boom, one of refuse
