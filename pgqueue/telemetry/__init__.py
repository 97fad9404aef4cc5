"""Observability: worker metrics (Prometheus), the database view of the
queues (``pgqueue metrics``), OpenTelemetry traces, and the doctor.

Nothing here imports ``prometheus_client`` or ``opentelemetry`` at import
time: each extra is imported when it is used, and only when installed.

Public entry points:

- :func:`pgqueue.telemetry.database_view.collect` / ``App.queue_view()`` —
  the database view as a :class:`~pgqueue.telemetry.database_view.QueueView`;
- ``App.metrics_text()`` — that view as Prometheus text (what a dashboard
  serves at ``/metrics``);
- ``App.doctor()`` — a list of :class:`pgqueue.telemetry.doctor.Finding`.
"""
