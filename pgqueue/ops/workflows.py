"""Jobs with dependencies and workflows: enqueue a graph in one statement,
read and cancel workflows, a job's dependencies (SQL in
``sql/queries/workflows.sql``; releases happen in ``sql/schema.sql``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pgqueue import validation
from pgqueue.errors import InvalidInput, InvalidOption, JobNotFound, WorkflowNotFound
from pgqueue.models import Enqueued, JobSpec, JobStatus
from pgqueue.ops import Execute, Op, OpContext
from pgqueue.ops.enqueue import _JobBuilder
from pgqueue.ops.inspect import _job_id, job_from_row

if TYPE_CHECKING:
    from pgqueue.workflow import Workflow, WorkflowInfo, WorkflowRun

#: What a step's or a dependent job's options may not use: a dedup hit would
#: make two steps one job.
_NOT_IN_GRAPHS = ("dedup_key", "dedup_window", "debounce")


def _step(builder: _JobBuilder, spec: JobSpec) -> dict[str, Any]:
    for key in _NOT_IN_GRAPHS:
        if getattr(spec, key) is not None:
            raise InvalidInput(f"{key} cannot be used with dependencies (depends_on, after=)")
    step: dict[str, Any] = {"job": builder.build(spec)}
    if spec.depends_on:
        if isinstance(spec.depends_on, str | bytes) or not isinstance(spec.depends_on, Sequence):
            raise InvalidOption(f"depends_on takes a list of job ids, got {spec.depends_on!r}")
        step["depends_on"] = sorted({_job_id(i) for i in spec.depends_on})
    if spec.allow_failed:
        step["allow_failed"] = True
    return step


def enqueue_dependent(ctx: OpContext, specs: Sequence[JobSpec]) -> Op[list[Enqueued]]:
    """Jobs of which some have ``depends_on``, in one statement; waiting until
    their dependencies end (JobNotFound, nothing written, for an unknown id)."""
    builder = _JobBuilder(ctx)
    steps = [_step(builder, s) for s in specs]
    rows = yield from _graph(ctx, None, steps)
    return [Enqueued(job_id, True) for _, job_id in rows]


def enqueue_workflow(ctx: OpContext, workflow: Workflow) -> Op[WorkflowRun]:
    """Every step of ``workflow`` in one statement."""
    from pgqueue.workflow import WorkflowRun

    if not workflow.steps:
        raise InvalidInput(f"workflow {workflow.name!r} has no steps")
    specs = workflow.steps
    if ctx.middleware:
        from pgqueue.middleware import before_enqueue

        changed = before_enqueue(ctx.middleware, [s.spec for s in specs])
    else:
        changed = [s.spec for s in specs]
    builder = _JobBuilder(ctx)
    steps = []
    for step, spec in zip(specs, changed, strict=True):
        doc = _step(builder, spec)
        doc["name"] = step.name
        if step.after:
            doc["after"] = [p.index for p in step.after]
        if step.allow_failed:
            doc["allow_failed"] = True
        steps.append(doc)
    rows = yield from _graph(ctx, workflow.name, steps)
    return WorkflowRun(
        rows[0][0], {s.name: job_id for s, (_, job_id) in zip(specs, rows, strict=True)}
    )


def _graph(ctx: OpContext, name: str | None, steps: list[dict[str, Any]]) -> Op[list[Any]]:
    """(workflow id, job id) per step, in one statement."""
    # Payloads were checked by the builder, their sizes are checked by the database.
    doc = json.dumps({"graph": steps, "workflow": name}, separators=(",", ":"), ensure_ascii=False)
    try:
        rows = yield Execute("job_enqueue_graph", {"graph": doc})
    except Exception as exc:
        missing = _missing_job(exc)
        if missing is None:
            raise
        raise JobNotFound(missing) from None
    ids = [r[0] for r in rows]
    # A workflow's id is its first step's job id (enqueue_graph).
    workflow_id = ids[0] if name is not None else None
    return [(workflow_id, i) for i in ids]


def _missing_job(exc: Exception) -> int | None:
    """The id of ``pgqueue: job N not found`` (SQLSTATE P0002) from enqueue_graph."""
    sqlstate = getattr(exc, "sqlstate", None) or getattr(
        getattr(exc, "__cause__", None), "sqlstate", None
    )
    text = str(exc)
    if sqlstate != "P0002" and "not found" not in text:
        return None
    for word in text.replace(":", " ").split():
        if word.isdigit():
            return int(word)
    return None


def get_workflow(workflow_id: int) -> Op[WorkflowInfo]:
    """A workflow, each step as a Job, and which steps each waits for."""
    from pgqueue.workflow import WorkflowInfo

    ident = _workflow_id(workflow_id)
    head = yield Execute("workflow_get", {"workflow_id": ident}, fetch="one", rows="dict")
    if head is None:
        raise WorkflowNotFound(ident)
    rows = yield Execute("workflow_steps", {"workflow_id": ident}, rows="dict")
    edges = yield Execute("workflow_edges", {"workflow_id": ident})
    names = {r["id"]: r["step"] for r in rows}
    steps = {r["step"]: job_from_row(r) for r in rows}
    after: dict[str, list[str]] = {name: [] for name in steps}
    for job_id, depends_on in edges:
        if job_id in names and depends_on in names:
            after[names[job_id]].append(names[depends_on])
    return WorkflowInfo(
        ident, head["name"], _status(steps.values()), head["created_at"], steps, after
    )


def _status(jobs: Any) -> Any:
    statuses = [j.status for j in jobs]
    if not all(s.is_final for s in statuses):
        return "running"
    return "succeeded" if all(s is JobStatus.SUCCEEDED for s in statuses) else "failed"


def list_workflows(status: str | None = None, limit: int = 50) -> Op[list[WorkflowInfo]]:
    """Workflows, newest first, with their steps."""
    if status is not None and status not in ("running", "succeeded", "failed"):
        raise InvalidOption(f"unknown workflow status {status!r}: running, succeeded or failed")
    limit = validation.positive_int("limit", limit, 1000)
    rows = yield Execute(
        "workflow_list",
        {
            "workflow_id": None,
            "status": status,
            "limit": limit,
            "scan": limit if status is None else limit * 20,
        },
    )
    out = []
    for row in rows:
        out.append((yield from get_workflow(int(row[0]))))
    return out


def cancel_workflow(workflow_id: int) -> Op[int]:
    """Cancel the workflow's live steps (running ones are asked to stop)."""
    ident = _workflow_id(workflow_id)
    head = yield Execute("workflow_get", {"workflow_id": ident}, fetch="one")
    if head is None:
        raise WorkflowNotFound(ident)
    rows = yield Execute("workflow_cancel", {"workflow_id": ident})
    return len(rows)


def dependencies(job_id: int) -> Op[tuple[int | None, list[tuple[str, str, Any]]]]:
    """A job's workflow id and its direct dependencies (name, status, result)."""
    rows = yield Execute("job_dependencies", {"job_id": job_id})
    workflow_id = rows[0][0] if rows else None
    return workflow_id, [(r[1], r[2], r[3]) for r in rows if r[1] is not None]


def _workflow_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"workflow id must be a positive integer, got {value!r}")
    return value
