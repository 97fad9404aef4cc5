"""Named SQL statements loaded from ``sql/queries/*.sql``.

A file holds statements under ``-- name: <noun_verb>`` headers. The schema name
and NOTIFY channel are substituted once per schema (quoted by psycopg) and
cached; parameters are always passed separately as ``%(name)s``. Every name in
:data:`QueryName` must exist in the files, checked at import, so a typo in a
query name fails in mypy or at import rather than at run time.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Literal, get_args

from psycopg import sql

from pgqueue._resources import sql_dir

QueryName = Literal[
    "job_enqueue_one",
    "step_list",
    "step_store",
    "step_wait_event",
    "event_send",
    "job_enqueue_payloads",
    "job_enqueue_batch",
    "job_enqueue_windowed",
    "job_lease",
    "job_ready_queues",
    "retention_get",
    "retention_set",
    "retention_plan",
    "retention_create_leaf",
    "retention_drop_leaf",
    "retention_purge",
    "maintenance_claim",
    "maintenance_done",
    "maintenance_release",
    "maintenance_state",
    "job_set_progress",
    "job_enqueue_graph",
    "workflow_get",
    "workflow_steps",
    "workflow_edges",
    "workflow_list",
    "job_dependencies",
    "job_ack_many",
    "job_fail_many",
    "job_nack_many",
    "job_extend_many",
    "job_cancel_flags",
    "job_next_due",
    "job_watch_finish",
    "job_result",
    "job_get",
    "job_attempt_history",
    "job_list",
    "job_list_finished",
    "job_list_window",
    "job_cancel",
    "job_status",
    "job_replay",
    "job_requeue_dead",
    "queue_metrics",
    "queue_status_sample",
    "job_wait_context",
    "queue_set_paused",
    "queue_set_limits",
    "job_reap_expired",
    "job_archive_batch",
    "job_archive_count",
    "attempt_prune_batch",
    "archive_prune_batch",
    "prune_count",
    "table_stats",
    "worker_register",
    "worker_heartbeat",
    "worker_deregister",
    "schedule_now",
    "schedule_get",
    "schedule_list",
    "schedule_upsert",
    "schedule_enable",
    "schedule_disable",
    "schedule_remove",
    "schedule_run_now",
    "schedule_due",
    "schedule_fire_many",
    "schedule_register_periodic",
    "job_dead_count",
    "table_vacuum_analyze",
    "health_server",
    "health_schema_revision",
    "health_stuck_jobs",
    "health_dead_workers",
    "health_queue_backlog",
    # task registry, task settings and limits, task stats, worker states
    "task_publish",
    "task_settings_all",
    "task_settings_upsert",
    "task_limits_set",
    "task_settings_prune",
    "task_list",
    "task_wait_context",
    "task_unknown_waiting",
    "task_stats",
    "task_stats_window",
    "worker_mark_lost",
    "worker_prune_lost",
    "worker_forget",
    "worker_list_states",
    "archive_partitioning_get",
    "archive_partitions_for_archive",
    "archive_partitions_drop",
    "archive_partition_prepare",
    "archive_partition_validate",
    "archive_partition_index",
    "archive_partition_switch",
    # sql/queries/operator.sql
    "job_cancel_count",
    "job_status_many",
    "queue_list",
    "queue_delete",
    "schema_summary",
    "schema_drop",
    "schema_drop_scratch",
    "schema_create",
    "job_became_due",
    # sql/queries/testing.sql (pgqueue.testing.drain)
    "drain_clock",
    "drain_queue_heads",
    "drain_job_due",
    "attempt_outcomes",
    # telemetry (metrics, tracing) and doctor
    "job_enqueue_batch_traced",
    "job_lease_observed",
    "metrics_queue_live",
    "metrics_status_sample",
    "metrics_status_estimates",
    "metrics_workers_alive",
    "doctor_transactions",
    "doctor_prepared_transactions",
    "doctor_replication_slots",
    "doctor_tables",
    "doctor_notify_queue",
    "doctor_connections",
    "doctor_backend",
    "doctor_archive_backlog",
    # sql/queries/roles.sql (pgqueue.grants, pgqueue.http)
    "role_current_user",
    "role_membership",
    "role_grants_present",
    "role_grants_latest",
    "role_grants_all",
    "role_grants_forget_dropped",
    "schema_owner",
    # sql/queries/http.sql (the SQL worker API of pgqueue.http)
    "worker_api_lease",
    "worker_api_extend_many",
    "worker_api_extend",
    "worker_api_job_status",
    "worker_api_ack",
    "worker_api_fail",
    "worker_api_nack",
    "worker_api_ack_many",
    "worker_api_ack_results",
    # sql/queries/dashboard.sql
    "dashboard_throughput",
    "dashboard_dead_groups",
    "dashboard_dead_group_ids",
    "dashboard_change_mark",
]

_HEADER = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.MULTILINE)


def channel_for(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema."""
    return f"pgqueue.{schema}"


def announce_channel_for(schema: str) -> str:
    """The channel on which a schema announces where jobs became ready, for
    the workers' lease cursors (``announce_ready``; no schema name holds a colon)."""
    return f"{channel_for(schema)}:k"


def _parse(text: str) -> dict[str, str]:
    """Split one file into {name: statement}; the text before the first header is a preamble."""
    matches = list(_HEADER.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = "\n".join(
            line for line in text[m.end() : end].strip().splitlines() if not line.startswith("--")
        ).strip()
        out[m.group("name")] = body.rstrip(";").strip()
    return out


@cache
def _templates() -> dict[str, str]:
    templates: dict[str, str] = {}
    for path in sorted((sql_dir() / "queries").glob("*.sql")):
        for name, body in _parse(path.read_text(encoding="utf-8")).items():
            if name in templates:
                raise RuntimeError(f"query {name!r} is defined twice (second time in {path.name})")
            templates[name] = body
    return templates


def render(template: str, schema: str) -> str:
    """Substitute the ``{schema}`` and ``{channel}`` markers with quoted values."""
    return template.replace("{schema}", sql.Identifier(schema).as_string()).replace(
        "{channel}", sql.Literal(channel_for(schema)).as_string()
    )


_NAMED = re.compile(r"%\((\w+)\)s")


def parameter_names(name: QueryName) -> tuple[str, ...]:
    """The ``%(name)s`` parameters of a statement in order of appearance,
    one entry per placeholder: the tuple :meth:`Queries.positional` takes."""
    return tuple(_NAMED.findall(_templates()[name]))


class Queries:
    """The statements of one schema, rendered once."""

    __slots__ = ("_positional", "_rendered", "schema")

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._rendered = {name: render(text, schema) for name, text in _templates().items()}
        self._positional: dict[str, str] = {}

    def __getitem__(self, name: QueryName) -> str:
        return self._rendered[name]

    def positional(self, name: QueryName) -> str:
        """The statement with ``%s`` placeholders, taking a tuple in the order
        of :func:`parameter_names`: psycopg then neither builds nor reorders a
        list from a dict per call. The same str object every time (psycopg
        keeps a cursor's adapters while the query object stays the same)."""
        text = self._positional.get(name)
        if text is None:
            text = render(_NAMED.sub("%s", _templates()[name]), self.schema)
            text = self._positional.setdefault(name, text)
        return text


@cache
def queries_for(schema: str) -> Queries:
    """The cached :class:`Queries` of ``schema`` (validated by the caller)."""
    return Queries(schema)


def _check_names() -> None:
    declared = set(get_args(QueryName))
    found = set(_templates())
    if missing := declared - found:
        raise RuntimeError(f"queries declared in QueryName but missing in sql/queries: {missing}")
    if extra := found - declared:
        raise RuntimeError(f"queries in sql/queries missing from QueryName: {extra}")


_check_names()
