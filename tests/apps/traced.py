"""A worker app whose process exports its OpenTelemetry spans as JSON lines
to the file named by PGQUEUE_TEST_SPANS (the SDK is configured at import)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import pgqueue


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                out.write(json.dumps(span_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def span_dict(span: ReadableSpan) -> dict[str, object]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(span.parent.span_id, "016x") if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [e.name for e in span.events],
        "links": len(span.links),
    }


if spans_path := os.environ.get("PGQUEUE_TEST_SPANS"):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(spans_path)))
    trace.set_tracer_provider(provider)

app = pgqueue.App(os.environ.get("PGQUEUE_DSN"))


@app.task
def traced_ok(value: int) -> int:
    with trace.get_tracer("tests").start_as_current_span("inside the task"):
        return value


@app.task
async def traced_async(value: int) -> int:
    with trace.get_tracer("tests").start_as_current_span("inside the async task"):
        return value


@app.task(max_attempts=1)
def traced_fail(message: str) -> None:
    raise ValueError(message)
