"""The OpenAPI 3.1 document of the HTTP API, built from the same field
declarations the server checks bodies with (:mod:`pgqueue.http.schemas`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqueue.http import schemas
from pgqueue.version import __version__

if TYPE_CHECKING:
    from pgqueue.http.api import Api

_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
_TIME = {"type": "string", "format": "date-time"}
_INT = {"type": "integer"}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_TEXT = {"type": ["string", "null"]}

RESPONSES: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": {"type": "string"},
            "message": {"type": "string"},
            "field": {"type": "string"},
        },
    },
    "Enqueued": {
        "type": "object",
        "required": ["job_id", "created"],
        "properties": {"job_id": _INT, "created": {"type": "boolean"}},
    },
    "EnqueuedBatch": {
        "type": "object",
        "required": ["job_ids", "created"],
        "properties": {
            "job_ids": {"type": "array", "items": _INT},
            "created": {"type": "array", "items": {"type": "boolean"}},
        },
    },
    "Attempt": {
        "type": "object",
        "properties": {
            "attempt": _INT,
            # null while it runs, unless the token is an admin's (the lease token)
            "attempt_id": _NULLABLE_INT,
            "worker_id": _NULLABLE_TEXT,
            "started_at": _TIME,
            "finished_at": _NULLABLE_TIME,
            "outcome": {"type": "string"},
            "error_code": _NULLABLE_TEXT,
            "error_message": _NULLABLE_TEXT,
            "traceback": _NULLABLE_TEXT,
            "latency_ms": {"type": ["number", "null"]},
        },
    },
    "Job": {
        "type": "object",
        "required": ["id", "queue", "task", "payload", "status", "attempts"],
        "properties": {
            "id": _INT,
            "queue": {"type": "string"},
            "task": {"type": "string"},
            "payload": {"type": "object"},
            "priority": _INT,
            "status": {
                "type": "string",
                "enum": [
                    "queued",
                    "scheduled",
                    "waiting",
                    "running",
                    "succeeded",
                    "dead",
                    "cancelled",
                ],
            },
            "run_at": _TIME,
            "attempts": _INT,
            "max_attempts": _INT,
            "dedup_key": _NULLABLE_TEXT,
            "serial_key": _NULLABLE_TEXT,
            # Present only when the job has one (pgqueue.Job.group_key).
            "group_key": {"type": "string"},
            "created_at": _TIME,
            "finished_at": _NULLABLE_TIME,
            "last_error": _NULLABLE_TEXT,
            "result": {},
            "attempt_history": {"type": "array", "items": {"$ref": "#/components/schemas/Attempt"}},
            # A durable task's stored steps, sleeps and event waits (pgqueue.StepRecord).
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "status", "kind", "started_at"],
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string", "enum": ["step", "sleep", "event"]},
                        "status": {"type": "string"},
                        "result": {},
                        "started_at": _TIME,
                        "finished_at": _NULLABLE_TIME,
                        "wake_at": _NULLABLE_TIME,
                        "event_key": _NULLABLE_TEXT,
                    },
                },
            },
        },
    },
    "JobState": {
        "type": "object",
        "required": ["job_id", "status"],
        "properties": {"job_id": _INT, "status": {"type": "string"}},
    },
    "Acked": {
        "type": "object",
        "required": ["job_id", "acked"],
        "properties": {"job_id": _INT, "acked": {"type": "boolean"}},
    },
    "EventSent": {
        "type": "object",
        "required": ["key", "released"],
        "properties": {"key": {"type": "string"}, "released": {"type": "integer", "minimum": 0}},
    },
    "Extended": {
        "type": "object",
        "required": ["extended", "lease_expires_at", "cancel_requested"],
        "properties": {
            "extended": {"type": "boolean"},
            "lease_expires_at": _TIME,
            "cancel_requested": {"type": "boolean"},
        },
    },
    "AckedMany": {
        "type": "object",
        "required": ["acked", "lease_lost"],
        "properties": {
            "acked": {"type": "array", "items": _INT},
            "lease_lost": {"type": "array", "items": _INT},
        },
    },
    "LeasedJob": {
        "type": "object",
        "required": ["job_id", "attempt_id", "attempt", "task", "payload", "lease_expires_at"],
        "properties": {
            "job_id": _INT,
            "attempt_id": _INT,
            "attempt": _INT,
            "task": {"type": "string"},
            "payload": {"type": "object"},
            "lease_expires_at": _TIME,
        },
    },
    "Leased": {
        "type": "object",
        "required": ["jobs"],
        "properties": {
            "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/LeasedJob"}}
        },
    },
    "QueueMetrics": {
        "type": "object",
        "required": [
            "queue",
            "queued",
            "scheduled",
            "running",
            "succeeded",
            "dead",
            "cancelled",
            "oldest_ready_age_seconds",
            "paused",
        ],
        "properties": {
            "queue": {"type": "string"},
            **{
                k: _INT
                for k in ("queued", "scheduled", "running", "succeeded", "dead", "cancelled")
            },
            "oldest_ready_age_seconds": {"type": ["number", "null"]},
            "paused": {"type": "boolean"},
            "concurrency_limit": _NULLABLE_INT,
            "rate_limit": _NULLABLE_TEXT,
        },
    },
}

_ERRORS = {
    "400": "Not JSON, or not a JSON object",
    "401": "Missing or unknown token",
    "403": "The token's kind (or its database role) may not do this",
    "404": "Unknown job",
    "409": "Stale lease (lease_lost) or the job's state does not allow it (invalid_state)",
    "408": "The body did not arrive in time (timeout)",
    "413": "Body too large",
    "422": "A field is invalid (named in field and message)",
    "429": "This token is past its request rate or long-poll cap (rate_limited); "
    "retry after Retry-After seconds",
    "503": "The database is unavailable (unavailable), or the server is at its request or "
    "long-poll cap (busy); retry after Retry-After seconds when given",
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _operation(
    summary: str,
    answer: str,
    *,
    kind: str,
    body: str | None = None,
    body_required: bool = True,
    parameters: tuple[str, ...] = (),
    creates: bool = False,
) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{answer}"}}}
    responses: dict[str, Any] = (
        {
            "201": {"description": "Created (a batch: at least one job)", "content": content},
            "200": {
                "description": "Nothing created: each job's dedup_key named a live job, "
                "whose id is answered (created: false)",
                "content": content,
            },
        }
        if creates
        else {"200": {"description": "OK", "content": content}}
    )
    for code, text in _ERRORS.items():
        if code == "400" and body is None:
            continue
        responses[code] = _error(text)
    op: dict[str, Any] = {
        "summary": summary,
        "description": f"Needs a {kind} token (or a kind above it).",
        "operationId": summary.lower().replace(" ", "_").replace("/", "_"),
        "security": [{"bearer": []}],
        "responses": responses,
    }
    params = []
    if "id" in parameters:
        params.append(
            {
                "name": "id",
                "in": "path",
                "required": True,
                "schema": {"type": "integer", "minimum": 1, "maximum": schemas.INT64_MAX},
            }
        )
    if "queue" in parameters:
        params.append(
            {
                "name": "queue",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": schemas.QUEUE},
            }
        )
    if "key" in parameters:
        params.append(
            {
                "name": "key",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1, "pattern": schemas.NO_NUL},
            }
        )
    if "history" in parameters:
        params.append(
            {
                "name": "history",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": ["true", "false", "1", "0"]},
            }
        )
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    return op


def openapi_document(api: Api) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this server (its limits and features)."""
    bodies = [
        schemas.ENQUEUE,
        schemas.ENQUEUE_BATCH,
        api.lease_body,
        schemas.ACK,
        schemas.FAIL,
        schemas.NACK,
        schemas.EXTEND,
        schemas.ACK_MANY,
        schemas.SEND_EVENT,
    ]
    components = {b.name: b.schema() for b in bodies}
    # The batch's items are the enqueue body: refer to it.
    components["EnqueueBatchRequest"]["properties"]["jobs"]["items"] = {
        "$ref": "#/components/schemas/EnqueueRequest"
    }
    components.update(RESPONSES)
    lease = _operation(
        "Lease",
        "Leased",
        kind="worker",
        body="LeaseRequest",
        body_required=False,
        parameters=("queue",),
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "pgqueue HTTP API",
            "version": __version__,
            "description": (
                "Producers and workers without a database connection. Bodies of "
                f"at most {api.max_body_bytes} bytes; errors are {{error, message, field}}."
            ),
        },
        "paths": {
            "/v1/jobs": {
                "post": _operation(
                    "Enqueue", "Enqueued", kind="producer", body="EnqueueRequest", creates=True
                )
            },
            "/v1/jobs/batch": {
                "post": _operation(
                    "Enqueue batch",
                    "EnqueuedBatch",
                    kind="producer",
                    body="EnqueueBatchRequest",
                    creates=True,
                )
            },
            "/v1/jobs/{id}": {
                "get": _operation("Get job", "Job", kind="producer", parameters=("id", "history"))
            },
            "/v1/jobs/{id}/cancel": {
                "post": _operation("Cancel", "JobState", kind="producer", parameters=("id",))
            },
            "/v1/jobs/{id}/requeue": {
                "post": _operation("Requeue dead", "JobState", kind="admin", parameters=("id",))
            },
            "/v1/jobs/{id}/ack": {
                "post": _operation(
                    "Ack", "Acked", kind="worker", body="AckRequest", parameters=("id",)
                )
            },
            "/v1/jobs/{id}/fail": {
                "post": _operation(
                    "Fail", "JobState", kind="worker", body="FailRequest", parameters=("id",)
                )
            },
            "/v1/jobs/{id}/nack": {
                "post": _operation(
                    "Nack", "JobState", kind="worker", body="NackRequest", parameters=("id",)
                )
            },
            "/v1/jobs/{id}/extend": {
                "post": _operation(
                    "Extend", "Extended", kind="worker", body="ExtendRequest", parameters=("id",)
                )
            },
            "/v1/ack": {
                "post": _operation("Ack many", "AckedMany", kind="worker", body="AckManyRequest")
            },
            "/v1/queues/{queue}/lease": {"post": lease},
            "/v1/queues/{queue}/metrics": {
                "get": _operation(
                    "Queue metrics", "QueueMetrics", kind="producer", parameters=("queue",)
                )
            },
            "/v1/events/{key}": {
                "post": _operation(
                    "Send event",
                    "EventSent",
                    kind="producer",
                    body="SendEventRequest",
                    body_required=False,
                    parameters=("key",),
                )
            },
            "/v1/openapi.json": {
                "get": {
                    "summary": "This document",
                    "operationId": "openapi",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1",
                            "content": {"application/json": {"schema": {}}},
                        }
                    },
                }
            },
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
