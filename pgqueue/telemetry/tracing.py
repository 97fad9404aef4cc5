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
import json
import os
from collections.abc import MutableMapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from pgqueue.telemetry.observer import WorkerObserver

if TYPE_CHECKING:
    from pgqueue.worker.executor import RunningJob

SYSTEM = "pgqueue"
#: Links of one batch's send span (the SDK keeps 128 by default).
MAX_BATCH_LINKS = 128

#: Trace ids of jobs running in this process, for their log lines (job_id -> hex).
JOB_TRACE_IDS: dict[int, str] = {}


@cache
def _api() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def installed() -> bool:
    """Whether opentelemetry-api can be imported."""
    return _api() is not None


def enabled() -> bool:
    """Whether spans would be recorded: the API is installed and a tracer
    provider other than the API's default (which records nothing) is set.
    Asked on every enqueue: a provider set at any time counts from then on."""
    trace = _api()
    if trace is None:
        return False
    # The API's global provider, read directly while none is set: its
    # get_tracer_provider() then looks the environment up on every call (a
    # KeyError raised and caught: a few us of each enqueue). The variable
    # naming a provider to load is read once (it configures the process at
    # start); while it is set, get_tracer_provider() loads and sets that one.
    provider = getattr(trace, "_TRACER_PROVIDER", trace)
    if provider is None and not _provider_from_environment():
        return False
    if provider is None or provider is trace:  # (trace: an API without that global)
        provider = trace.get_tracer_provider()
    return not isinstance(provider, _not_recording())


@cache
def _provider_from_environment() -> bool:
    from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER

    return OTEL_PYTHON_TRACER_PROVIDER in os.environ


@cache
def _not_recording() -> tuple[type, ...]:
    """The API's providers that record nothing."""
    trace = _api()
    return (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def _tracer() -> Any:
    from pgqueue.version import __version__

    return _api().get_tracer("pgqueue", __version__)


# --- producer ------------------------------------------------------------------


class SendSpan:
    """The PRODUCER span of one enqueue call, and the carrier to store."""

    def __init__(self, queues: Sequence[str], count: int) -> None:
        from opentelemetry import propagate

        trace = _api()
        names = sorted(set(queues))
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if len(names) == 1:
            attributes["messaging.destination.name"] = names[0]
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        name = f"send {names[0]}" if len(names) == 1 else "send"
        self.span = _tracer().start_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.span))
        self.carrier = json.dumps(carrier) if carrier else None
        self.batch = count != 1

    def sent(self, job_ids: Sequence[int]) -> None:
        """The jobs were written: name them, end the span."""
        span = self.span
        if len(job_ids) == 1 and not self.batch:
            span.set_attribute("messaging.message.id", str(job_ids[0]))
        else:
            context = span.get_span_context()
            for job_id in job_ids[:MAX_BATCH_LINKS]:
                span.add_link(context, {"messaging.message.id": str(job_id)})
        span.end()

    def failed(self, exc: BaseException) -> None:
        trace = _api()
        self.span.record_exception(exc)
        self.span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
        self.span.end()


def send_span(queues: Sequence[str], count: int) -> SendSpan | None:
    """A started send span when tracing is on, else None."""
    return SendSpan(queues, count) if enabled() else None


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

    def started(self, rj: RunningJob) -> None:
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

    def run_context(self, rj: RunningJob) -> contextvars.Context | None:
        span = rj.observed
        if span is None:
            return None
        ctx = contextvars.copy_context()
        ctx.run(_attach, self.trace.set_span_in_context(span))
        return ctx

    def finished(self, rj: RunningJob, outcome: str, error: BaseException | None) -> None:
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
