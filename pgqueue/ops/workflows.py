"""Jobs with dependencies and workflows: enqueue a graph in one statement,
read and cancel workflows, a job's dependencies (SQL in
``sql/queries/workflows.sql``; releases happen in ``sql/schema.sql``)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from pgqueue import validation
from pgqueue.errors import InvalidInput, InvalidOption, JobNotFound, WorkflowNotFound
from pgqueue.models import Enqueued, Job, JobSpec, JobStatus, WorkflowInfo, WorkflowRun
from pgqueue.ops import Execute, Op, OpContext
from pgqueue.ops.enqueue import _JobBuilder, before_enqueue
from pgqueue.ops.inspect import _job_id, job_from_row
from pgqueue.ops.operator import CANCELLABLE, cancel_params


class GraphStep(Protocol):
    """What :func:`enqueue_workflow` reads of a step (a :class:`pgqueue.Step`)."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def spec(self) -> JobSpec: ...
    @property
    def after(self) -> Sequence[GraphStep]: ...
    @property
    def allow_failed(self) -> bool: ...


class Graph(Protocol):
    """What :func:`enqueue_workflow` reads of a workflow (a :class:`pgqueue.Workflow`)."""

    @property
    def name(self) -> str: ...
    @property
    def steps(self) -> Sequence[GraphStep]: ...


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


def enqueue_workflow(ctx: OpContext, workflow: Graph) -> Op[WorkflowRun]:
    """Every step of ``workflow`` in one statement."""
    if not workflow.steps:
        raise InvalidInput(f"workflow {workflow.name!r} has no steps")
    specs = workflow.steps
    if ctx.middleware:
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


_NOT_FOUND = re.compile(r"job (\d+) not found")


def _missing_job(exc: Exception) -> int | None:
    """The id in enqueue_graph's ``pgqueue: job N not found`` (SQLSTATE P0002)."""
    states = (getattr(exc, "sqlstate", None), getattr(exc.__cause__, "sqlstate", None))
    found = _NOT_FOUND.search(str(exc)) if "P0002" in states else None
    return int(found.group(1)) if found else None


def get_workflow(workflow_id: int) -> Op[WorkflowInfo]:
    """A workflow, each step as a Job, and which steps each waits for."""
    ident = _workflow_id(workflow_id)
    found = (yield from _load([ident])) if ident <= _MAX_ID else []
    if not found:
        raise WorkflowNotFound(ident)
    return found[0]


def _load(ids: list[int]) -> Op[list[WorkflowInfo]]:
    """These workflows, in this order (unknown ids left out): three
    statements however many there are."""
    params = {"workflow_ids": ids}
    heads = {h["id"]: h for h in (yield Execute("workflow_get", params, rows="dict"))}
    rows = yield Execute("workflow_steps", params, rows="dict")
    edges = yield Execute("workflow_edges", params)
    steps: dict[int, dict[str, Job]] = {i: {} for i in heads}
    after: dict[int, dict[str, list[str]]] = {i: {} for i in heads}
    step_of: dict[int, tuple[int, str]] = {}  # job id -> (workflow id, step name)
    for r in rows:
        steps[r["workflow_id"]][r["step"]] = job_from_row(r)
        after[r["workflow_id"]][r["step"]] = []
        step_of[r["id"]] = (r["workflow_id"], r["step"])
    for job_id, depends_on in edges:
        if job_id in step_of and depends_on in step_of:
            workflow, name = step_of[job_id]
            after[workflow][name].append(step_of[depends_on][1])
    return [
        WorkflowInfo(
            i,
            heads[i]["name"],
            _status(steps[i].values()),
            heads[i]["created_at"],
            steps[i],
            after[i],
        )
        for i in ids
        if i in heads
    ]


def _status(jobs: Any) -> Any:
    statuses = [j.status for j in jobs]
    if not all(s.is_final for s in statuses):
        return "running"
    return "succeeded" if all(s is JobStatus.SUCCEEDED for s in statuses) else "failed"


def list_workflows(
    status: str | None = None, limit: int = 50, name: str | None = None
) -> Op[list[WorkflowInfo]]:
    """Workflows, newest first, with their steps (``name``: only those so named)."""
    if status is not None and status not in ("running", "succeeded", "failed"):
        raise InvalidOption(f"unknown workflow status {status!r}: running, succeeded or failed")
    limit = validation.positive_int("limit", limit, 1000)
    if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= 255):
        raise InvalidOption(f"a workflow name is 1 to 255 characters, got {name!r}")
    rows = yield Execute(
        "workflow_list",
        {
            "status": status,
            "name": name,
            "limit": limit,
            "scan": limit if status is None else limit * 20,
        },
    )
    return (yield from _load([int(r[0]) for r in rows]))


def cancel_workflow(workflow_id: int) -> Op[int]:
    """Cancel the workflow's live steps (running ones are asked to stop)."""
    ident = _workflow_id(workflow_id)
    head = (
        (yield Execute("workflow_get", {"workflow_ids": [ident]}, fetch="one"))
        if ident <= _MAX_ID
        else None
    )
    if head is None:
        raise WorkflowNotFound(ident)
    params = cancel_params(
        None, None, None, CANCELLABLE, 10_000, workflow_id=ident, reason="workflow cancelled"
    )
    touched = 0
    while True:  # batches of 10,000: running steps already asked are not picked again
        rows = yield Execute("job_cancel", params)
        touched += len(rows)
        if len(rows) < params["limit"]:
            return touched


def dependencies(job_id: int) -> Op[tuple[int | None, list[tuple[str, str, Any]]]]:
    """A job's workflow id and its direct dependencies (name, status, result)."""
    rows = yield Execute("job_dependencies", {"job_id": job_id})
    workflow_id = rows[0][0] if rows else None
    return workflow_id, [(r[1], r[2], r[3]) for r in rows if r[1] is not None]


#: Ids are bigints: a larger one names no workflow (not a database error).
_MAX_ID = 2**63 - 1


def _workflow_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"workflow id must be a positive integer, got {value!r}")
    return value
