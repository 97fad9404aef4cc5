"""OpenTelemetry traces from enqueue to execution (``pgqueue[otel]``).

Producer: each enqueue call runs in a PRODUCER span ``send <queue>``; the
W3C trace context of that span (the global propagator's carrier, e.g.
``{"traceparent": ...}``) is stored with every job of the call. A batch
(``enqueue_many``) is one span, with one link per job naming its id.

Worker: each execution runs in a CONSUMER span ``process <task>`` whose
parent is the stored context; the task runs with that span current, so its
own spans and log lines join the trace. Exceptions are recorded and the
status set to ERROR on failure.

Zero cost when ``opentelemetry-api`` is not installed (one cached import
check), and the enqueue path stays the untraced statement while no SDK is
configured (the API's default provider records nothing).
"""

from __future__ import annotations

import contextvars
from collections.abc import MutableMapping
from typing import Any

from pgqueue.ops import producer_span
from pgqueue.ops.producer_span import SYSTEM, _api, _tracer
from pgqueue.telemetry.observer import ObservedJob, WorkerObserver

# The producer side is ops/producer_span.py, below the operation that opens
# it (ops/enqueue.py); its names stay readable here.
MAX_BATCH_LINKS = producer_span.MAX_BATCH_LINKS
SendSpan = producer_span.SendSpan
enabled = producer_span.enabled
installed = producer_span.installed
send_span = producer_span.send_span

#: Trace ids of jobs running in this process, for their log lines (job_id -> hex).
JOB_TRACE_IDS: dict[int, str] = {}


# --- worker --------------------------------------------------------------------


def parent_context(carrier: Any) -> Any:
    """The OTel context extracted from a stored carrier (None when absent or invalid)."""
    if not isinstance(carrier, dict):
        return None
    from opentelemetry import propagate

    clean = {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
    return propagate.extract(clean) if clean else None


class TracingObserver(WorkerObserver):
    """Runs every job in a CONSUMER span ``process <task>``."""

    wants_lease_details = True

    def __init__(self) -> None:
        self.trace = _api()
        self.tracer = _tracer()

    def started(self, rj: ObservedJob) -> None:
        trace, job = self.trace, rj.job
        span = self.tracer.start_span(
            f"process {job.task}",
            context=parent_context(getattr(job, "trace_context", None)),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.job_id),
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "pgqueue.task": job.task,
                "pgqueue.attempt": job.attempt,
                "pgqueue.attempt_id": job.attempt_id,
            },
        )
        rj.observed = span
        span_context = span.get_span_context()
        if span_context.is_valid:
            JOB_TRACE_IDS[job.job_id] = format(span_context.trace_id, "032x")

    def run_context(self, rj: ObservedJob) -> contextvars.Context | None:
        span = rj.observed
        if span is None:
            return None
        ctx = contextvars.copy_context()
        ctx.run(_attach, self.trace.set_span_in_context(span))
        return ctx

    def finished(self, rj: ObservedJob, outcome: str, error: BaseException | None) -> None:
        span = rj.observed
        if span is None:
            return
        rj.observed = None
        trace = self.trace
        span.set_attribute("pgqueue.outcome", outcome)
        if outcome != "succeeded":
            if error is not None:
                span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, outcome))
        span.end()
        JOB_TRACE_IDS.pop(rj.job.job_id, None)


def _attach(otel_context: Any) -> None:
    from opentelemetry import context

    context.attach(otel_context)


def add_trace_id(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: ``trace_id`` on lines about a traced job, or
    logged inside an active span."""
    if "trace_id" in event_dict or _api() is None:
        return event_dict
    job_id = event_dict.get("job_id")
    trace_id = JOB_TRACE_IDS.get(job_id) if isinstance(job_id, int) else None
    if trace_id is None:
        span_context = _api().get_current_span().get_span_context()
        if span_context.is_valid:
            trace_id = format(span_context.trace_id, "032x")
    if trace_id is not None:
        event_dict["trace_id"] = trace_id
    return event_dict
