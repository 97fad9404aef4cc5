"""OpenTelemetry across processes: enqueue here under an in-memory SDK, run
in a real worker process that exports its spans to a file, and check the
links from the PRODUCER span to each CONSUMER span."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pgqueue
from tests.fixtures.workers import REPO_ROOT, Workers, wait_until

TRACED_APP = "tests.apps.traced:app"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider for this test only (the global one is set once
    per process, so it is swapped in and restored)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield memory
    provider.shutdown()


def worker_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_spans(path: Path, name: str, count: int, worker: Any) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]] | None:
        spans = [s for s in worker_spans(path) if s["name"] == name]
        return spans if len(spans) >= count else None

    spans: list[dict[str, Any]] = wait_until(found, 60.0, f"{count} spans {name!r}", [worker])
    return spans


def test_enqueue_to_execution_across_processes(
    exporter: InMemorySpanExporter, workers: Workers, db_dsn: str, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    with pgqueue.App(db_dsn) as producer:
        with trace.get_tracer("tests").start_as_current_span("request") as request:
            # (This producer does not know the tasks: with a queue given the
            # span names it; without, the task registry picks it, 0006.)
            ok = producer.enqueue("traced_ok", {"value": 1}, queue="default")
            failing = producer.enqueue("traced_fail", {"message": "no luck"}, queue="other")
        batch = producer.enqueue_many(
            [pgqueue.JobSpec("traced_async", {"value": i}, queue="default") for i in range(3)]
        )
    sent = {s.name: s for s in exporter.get_finished_spans() if s.kind.name == "PRODUCER"}
    assert set(sent) == {"send default", "send other"}
    send_ok = next(
        s for s in exporter.get_finished_spans()
        if s.name == "send default" and s.attributes.get("messaging.message.id") == str(ok.job_id)
    )  # fmt: skip
    assert send_ok.parent is not None
    assert send_ok.parent.span_id == request.get_span_context().span_id
    assert send_ok.attributes["messaging.system"] == "pgqueue"
    assert send_ok.attributes["messaging.destination.name"] == "default"
    batch_spans = [s for s in exporter.get_finished_spans() if len(s.links) == 3]
    assert len(batch_spans) == 1  # one span for enqueue_many, one link per job
    send_batch = batch_spans[0]
    assert send_batch.attributes["messaging.batch.message_count"] == 3
    assert sorted(link.attributes["messaging.message.id"] for link in send_batch.links) == sorted(
        str(r.job_id) for r in batch
    )

    worker = workers.spawn(
        "--no-scheduler", app=TRACED_APP, env={"PGQUEUE_TEST_SPANS": str(spans_file)}
    )
    workers.wait_statuses([ok.job_id, failing.job_id, *(r.job_id for r in batch)])

    processed = {s["attributes"]["messaging.message.id"]: s for s in
                 wait_spans(spans_file, "process traced_ok", 1, worker)
                 + wait_spans(spans_file, "process traced_fail", 1, worker)
                 + wait_spans(spans_file, "process traced_async", 3, worker)}  # fmt: skip
    trace_id = format(send_ok.context.trace_id, "032x")

    run_ok = processed[str(ok.job_id)]
    assert run_ok["kind"] == "CONSUMER"
    assert run_ok["trace_id"] == trace_id
    assert run_ok["parent_span_id"] == format(send_ok.context.span_id, "016x")
    assert run_ok["status"] != "ERROR"
    assert run_ok["attributes"]["messaging.system"] == "pgqueue"
    assert run_ok["attributes"]["messaging.destination.name"] == "default"
    assert run_ok["attributes"]["messaging.operation.type"] == "process"
    # The task ran with the CONSUMER span current: its own span is a child.
    inside = wait_spans(spans_file, "inside the task", 1, worker)[0]
    assert inside["parent_span_id"] == run_ok["span_id"]

    run_fail = processed[str(failing.job_id)]
    assert run_fail["trace_id"] == trace_id
    assert run_fail["status"] == "ERROR"
    assert "exception" in run_fail["events"]
    assert run_fail["attributes"]["messaging.destination.name"] == "other"

    batch_span_id = format(send_batch.context.span_id, "016x")
    for r in batch:
        run = processed[str(r.job_id)]
        assert run["parent_span_id"] == batch_span_id
    inside_async = wait_spans(spans_file, "inside the async task", 3, worker)
    assert {s["parent_span_id"] for s in inside_async} == {
        processed[str(r.job_id)]["span_id"] for r in batch
    }

    # Log lines about a job carry its trace id.
    succeeded = [e for e in worker.logged("job succeeded") if e.get("job_id") == ok.job_id]
    assert succeeded
    assert succeeded[0]["trace_id"] == trace_id
    failed = [e for e in worker.logged("job failed") if e.get("job_id") == failing.job_id]
    assert failed
    assert failed[0]["trace_id"] == trace_id


def test_sql_enqueue_takes_a_traceparent(workers: Workers, db_dsn: str, tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pgqueue.enqueue('traced_ok', '{\"value\": 2}', traceparent => %s)",
            (f"00-{trace_id}-{span_id}-01",),
        ).fetchone()
        assert row is not None
        job_id = row[0]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="traceparent"):
            conn.execute("SELECT pgqueue.enqueue('traced_ok', traceparent => 'nonsense')")
        untraced = conn.execute("SELECT pgqueue.enqueue('traced_ok', '{\"value\": 3}')").fetchone()
        assert untraced is not None
        stored = dict(conn.execute("SELECT id, trace_context FROM pgqueue.jobs").fetchall())
    assert stored[job_id] == {"traceparent": f"00-{trace_id}-{span_id}-01"}
    assert stored[untraced[0]] is None
    worker = workers.spawn(
        "--no-scheduler", app=TRACED_APP, env={"PGQUEUE_TEST_SPANS": str(spans_file)}
    )
    workers.wait_statuses([job_id, untraced[0]])
    runs = {
        s["attributes"]["messaging.message.id"]: s
        for s in wait_spans(spans_file, "process traced_ok", 2, worker)
    }
    assert runs[str(job_id)]["trace_id"] == trace_id
    assert runs[str(job_id)]["parent_span_id"] == span_id
    assert runs[str(untraced[0])]["parent_span_id"] is None  # a new root trace


def test_untraced_enqueue_stores_no_context(app: pgqueue.App, db_dsn: str) -> None:
    # opentelemetry is installed here, but no SDK is configured: nothing recorded.
    job_id = app.enqueue("anything", {}).job_id
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT trace_context FROM pgqueue.jobs WHERE id = %s", (job_id,))
        assert row.fetchone() == (None,)


def test_import_pgqueue_imports_no_extra() -> None:
    code = (
        "import sys, pgqueue, pgqueue.worker.worker, pgqueue_cli.main\n"
        "bad = [m for m in sys.modules if m.startswith(('opentelemetry', 'prometheus_client'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=60)
