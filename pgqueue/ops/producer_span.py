"""The producer side of tracing (see :mod:`pgqueue.telemetry.tracing`): the
PRODUCER span of one enqueue call and the W3C trace context stored with its
jobs. Here, below the operations, because ``ops/enqueue.py`` opens it;
:mod:`pgqueue.telemetry.tracing` re-exports these names.

Zero cost when ``opentelemetry-api`` is not installed (one cached import
check), and the enqueue path stays the untraced statement while no SDK is
configured (the API's default provider records nothing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import cache
from typing import Any

SYSTEM = "pgqueue"
#: Links of one batch's send span (the SDK keeps 128 by default).
MAX_BATCH_LINKS = 128


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
