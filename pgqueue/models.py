"""Public data types returned and accepted by the API."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, TypedDict

#: Field metadata: JSON output omits the field while it holds its default.
OMIT_DEFAULT = {"json": "omit_default"}


class JobStatus(enum.StrEnum):
    """Status of a job as users see it (``scheduled`` = queued with a future run_at)."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: Waits for its dependencies (``depends_on``, a workflow's ``after``); never leased.
    WAITING = "waiting"

    @property
    def is_final(self) -> bool:
        """True for succeeded, dead and cancelled."""
        return self in _FINAL


_FINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED})


class AttemptOutcome(enum.StrEnum):
    """How one attempt ended (``running`` while it runs)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRY = "retry"
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"
    RELEASED = "released"
    #: The task raised :class:`pgqueue.Snooze`: queued again, no attempt spent.
    SNOOZED = "snoozed"
    #: ``context.sleep()``: queued again at the wake-up time, no attempt spent.
    SLEPT = "slept"
    #: ``context.wait_for_event()``: the job waits for the event, no attempt spent.
    WAITED = "waited"


class Enqueued(NamedTuple):
    """Result of an enqueue: the job id and whether a new job was created
    (``False``: a live job with the same dedup key exists and this is its id)."""

    job_id: int
    created: bool


class JobSpec(NamedTuple):
    """One job for :meth:`pgqueue.App.enqueue_many`; ``None`` fields take the
    task's defaults (or the queue's). Immutable; a named tuple because a bulk
    enqueue builds one per job (about 3 times cheaper than a frozen dataclass).

    The one description of the enqueue options: each field after ``payload``
    is an option, with its type, its default and what it means. Every way in
    (``App.enqueue``, ``Task.with_options``, ``Workflow.add``, schedules, the
    CLI, the HTTP API) builds a JobSpec; ``pgqueue/ops/enqueue.py`` checks each
    option (``_JobBuilder``, with :mod:`pgqueue.validation`) and the SQL
    function ``enqueue_resolve`` resolves the defaults (priority precedence
    included) and validates again in the database, for every enqueue path.
    :class:`EnqueueOptions` is the keyword form of the options for typing
    ``**options`` (a test holds the two equal)."""

    task: str
    payload: dict[str, Any] | None = None
    queue: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: float | str | timedelta | None = None
    max_attempts: int | None = None
    dedup_key: str | None = None
    serial_key: str | None = None
    #: No new job when one with this (queue, dedup_key) was created within
    #: this many seconds, finished or not (the hit's id comes back).
    dedup_window: float | timedelta | None = None
    #: While the job holding dedup_key is still queued, replace its payload and
    #: move its run_at to now + debounce seconds instead of creating one.
    debounce: float | timedelta | None = None
    #: Up to 16 labels of ``[A-Za-z0-9_.:-]{1,64}`` (``list_jobs(tags=...)``).
    tags: Sequence[str] | None = None
    #: A JSON object of at most 8 KiB stored with the job, for people and tools.
    meta: dict[str, Any] | None = None
    #: Ids of jobs this one waits for (it runs once they all succeeded).
    depends_on: Sequence[int] | None = None
    #: Run once every dependency ended, whatever its end (else a dead or
    #: cancelled dependency cancels this job).
    allow_failed: bool = False
    #: The tenant, customer, API key or domain the job belongs to: 1 to 200
    #: characters without control characters (``list_jobs(group_key=...)``,
    #: ``context.group_key``).
    group_key: str | None = None


class EnqueueOptions(TypedDict, total=False):
    """The options of :class:`JobSpec` as keyword arguments: what
    ``**options: Unpack[EnqueueOptions]`` takes in :meth:`pgqueue.App.enqueue`
    and :meth:`pgqueue.Task.with_options`. Meanings and defaults are JobSpec's
    (``tests/unit/test_enqueue_options.py`` fails when the two differ)."""

    queue: str | None
    priority: int | None
    run_at: datetime | None
    delay: float | str | timedelta | None
    max_attempts: int | None
    dedup_key: str | None
    serial_key: str | None
    dedup_window: float | timedelta | None
    debounce: float | timedelta | None
    tags: Sequence[str] | None
    meta: dict[str, Any] | None
    depends_on: Sequence[int] | None
    allow_failed: bool
    group_key: str | None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job (items of :attr:`Job.attempt_history`, oldest first)."""

    attempt: int
    attempt_id: int
    worker_id: str | None
    started_at: datetime
    finished_at: datetime | None
    outcome: AttemptOutcome
    error_code: str | None
    error_message: str | None
    traceback: str | None
    latency_ms: float | None


@dataclass(frozen=True, slots=True)
class Job:
    """A job as stored (live or archived)."""

    id: int
    queue: str
    task: str
    payload: dict[str, Any]
    priority: int
    status: JobStatus
    run_at: datetime
    attempts: int
    max_attempts: int
    dedup_key: str | None
    serial_key: str | None
    created_at: datetime
    finished_at: datetime | None
    last_error: str | None
    result: Any
    attempt_history: list[Attempt] | None = field(default=None)
    # Fields added with tags, progress and snooze: JSON output (the CLI's
    # --json) leaves them out while they hold their default.
    tags: list[str] = field(default_factory=list, metadata=OMIT_DEFAULT)
    meta: dict[str, Any] | None = field(default=None, metadata=OMIT_DEFAULT)
    #: The last value the task gave ``context.set_progress`` (a number or an object).
    progress: Any = field(default=None, metadata=OMIT_DEFAULT)
    #: Times the job raised :class:`pgqueue.Snooze` (attempts it did not spend).
    snoozes: int = field(default=0, metadata=OMIT_DEFAULT)
    #: A durable task's stored steps, sleeps and event waits, oldest first
    #: (read by ``get_job``).
    steps: list[StepRecord] = field(default_factory=list, metadata=OMIT_DEFAULT)
    #: The group (tenant, customer, ...) it was enqueued with (``group_key``).
    group_key: str | None = field(default=None, metadata=OMIT_DEFAULT)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One stored record of a durable task (``context.step``, ``sleep``,
    ``wait_for_event``).

    ``status``: a step is ``succeeded`` (its ``result`` stored); a sleep
    ``sleeping`` until ``wake_at``, then ``slept``; an event wait
    ``waiting`` (for ``event_key``, until ``wake_at`` when it has a
    timeout), ``received`` (``result``: the payload) or ``timed_out``."""

    name: str
    status: str
    result: Any
    started_at: datetime
    finished_at: datetime | None
    kind: str = "step"
    wake_at: datetime | None = None
    event_key: str | None = None


@dataclass(slots=True)
class LeasedJob:
    """A job leased by a consumer; present it to ack/fail/nack/extend.

    ``attempt_id`` is the fencing token: once the lease is reaped and the job
    leased again, this object can no longer finish the job.
    """

    job_id: int
    attempt_id: int
    attempt: int
    task: str
    queue: str
    payload: dict[str, Any]
    lease_expires_at: datetime
    lease_seconds: int = 60
    #: Set only when a worker's metrics or tracing ask for them: seconds the
    #: job waited from its run_at to this lease (server clock), and the W3C
    #: trace context stored with it.
    wait_seconds: float | None = None
    trace_context: dict[str, Any] | None = None
    #: The job's tags and meta as enqueued (None when it has none).
    tags: list[str] | None = None
    meta: dict[str, Any] | None = None
    #: The job's group_key (None: none).
    group_key: str | None = None


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """Counts for one queue (``succeeded``: finished in the last hour; the
    others: what the live table holds now)."""

    queued: int
    scheduled: int
    running: int
    succeeded: int
    dead: int
    cancelled: int
    oldest_ready_age_seconds: float | None
    paused: bool
    concurrency_limit: int | None = None
    rate_limit: str | None = None
    #: Jobs waiting for their dependencies or for an event (JSON output: only when there are some).
    waiting: int = field(default=0, metadata=OMIT_DEFAULT)
    #: Of ``waiting``, durable tasks waiting for an event (``context.wait_for_event``).
    event_waiting: int = field(default=0, metadata=OMIT_DEFAULT)
    #: Of ``scheduled``, durable tasks in a ``context.sleep``.
    sleeping: int = field(default=0, metadata=OMIT_DEFAULT)


@dataclass(frozen=True, slots=True)
class Page:
    """A page of :meth:`pgqueue.App.list_jobs`; pass ``next_cursor`` back for
    the next page (``None`` on the last page). It iterates over its jobs and
    ``len(page)`` counts them::

        for job in app.list_jobs(status="dead"):
            print(job.id, job.last_error)
    """

    jobs: list[Job]
    next_cursor: str | None

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron schedule as stored. ``queue``, ``priority`` and ``max_attempts``
    are None when the task's defaults apply; ``next_fire_at`` is None while
    disabled; ``last_fire_at`` is the fire time of the last job it enqueued
    (that job's ``run_at``), ``last_job_id`` that job."""

    name: str
    cron: str
    timezone: str
    task: str
    queue: str | None
    payload: dict[str, Any]
    priority: int | None
    max_attempts: int | None
    enabled: bool
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    last_job_id: int | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Retention:
    """How long finished jobs are kept, by status, before they are deleted
    with their attempts (:meth:`pgqueue.App.set_retention`); ``timedelta(0)``:
    deleted when they end. Workers apply it (their maintenance pass)."""

    succeeded: timedelta
    cancelled: timedelta
    dead: timedelta
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RetentionPass:
    """What one maintenance pass did (``pgqueue prune``, the workers'
    maintenance): finished ``jobs`` deleted (whole time-range leaves, counted
    or estimated, plus rows of default leaves), ``archived_jobs`` deleted
    from the archive, ``leaves_created`` and ``leaves_dropped``, and the
    ``skipped`` steps that met a lock (tried again next pass)."""

    jobs: int = 0
    archived_jobs: int = 0
    leaves_created: int = 0
    leaves_dropped: int = 0
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class TableVacuum:
    """One pgqueue table after :meth:`pgqueue.App.vacuum`: its live tuples,
    its dead tuples before and after the VACUUM, and its size with indexes."""

    table: str
    live_tuples: int
    dead_tuples_before: int
    dead_tuples_after: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """What an operator set for a task (``set_task_options``,
    ``set_task_limit``); None fields fall back to the task's code defaults
    (or carry no limit). ``retry`` is ``[base, factor, max, jitter]``."""

    max_attempts: int | None = None
    lease_seconds: int | None = None
    timeout: float | None = None
    priority: int | None = None
    retry: list[float] | None = None
    concurrency: int | None = None
    rate: str | None = None  # "COUNT/SECONDSs", e.g. "100/60s"


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task as the database knows it: the defaults declared in its code
    (as the last worker that published it declared them; None when no worker
    published it), the operator's settings, the live workers that have it and
    how many of its jobs run now."""

    name: str
    queue: str | None
    priority: int | None
    max_attempts: int | None
    lease_seconds: int | None
    timeout: float | None
    retry: list[float] | None
    published_by: str | None
    first_seen_at: datetime | None
    last_seen_at: datetime | None
    settings: TaskSettings
    workers: list[str]
    running: int


@dataclass(frozen=True, slots=True)
class TaskStats:
    """Run statistics of one task over a time window: attempts that ran,
    jobs that succeeded, attempts that failed, jobs dead-lettered or
    cancelled, failed attempts that were retried, duration (last attempt's
    start to finish) and wait (run_at to the last attempt's start) in seconds,
    and the latest error. ``window_start``: where the window began (later
    than asked when ``task_stats(sample=)`` bounded it)."""

    task: str
    runs: int
    succeeded: int
    failed: int
    dead: int
    cancelled: int
    retries: int
    duration_p50: float | None
    duration_p95: float | None
    duration_max: float | None
    wait_p50: float | None
    wait_p95: float | None
    wait_max: float | None
    last_error: str | None
    window_start: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A registered worker: ``state`` is ``"alive"``, ``"stale"`` (heartbeat
    late) or ``"lost"`` (declared lost at ``lost_at``); ``running`` counts the
    jobs it still holds; ``version`` is its pgqueue version (None: the worker
    did not report one); ``pool`` is where it runs sync tasks, ``"thread"``
    or ``"process"`` (None: not reported, e.g. a worker of the HTTP API)."""

    id: str
    host: str
    pid: int
    queues: list[str] | None
    concurrency: int
    tasks: list[str] | None
    started_at: datetime
    last_heartbeat_at: datetime
    lost_at: datetime | None
    heartbeat_age_seconds: float
    state: str
    running: int
    version: str | None = None
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class UnknownTaskJobs:
    """Live jobs of a task that no live worker knows: they wait (workers
    without the task hand them back) until the grace period dead-letters
    them as ``unknown_task``."""

    task: str
    jobs: int
    oldest_age_seconds: float


class Replayed(int):
    """What ``replay()`` returns: the new job's id (an int, as before), also as
    ``job_id``, with the original's id as ``replayed_from`` — the fields of
    ``pgqueue jobs replay --json``."""

    replayed_from: int

    def __new__(cls, job_id: int, replayed_from: int) -> Replayed:
        value = super().__new__(cls, job_id)
        value.replayed_from = replayed_from
        return value

    @property
    def job_id(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"Replayed(job_id={int(self)}, replayed_from={self.replayed_from})"

    def __str__(self) -> str:
        return str(int(self))


@dataclass(frozen=True, slots=True)
class ArchiveLayout:
    """How ``jobs_archive`` is laid out (:meth:`pgqueue.App.archive_layout`):
    range-partitioned by finish time or a plain table, the period of a
    partition, how many partitions, and the upper bound of the partition that
    holds what was archived before the conversion (None once it was pruned)."""

    partitioned: bool
    period: str | None
    partitions: int
    legacy_upper: datetime | None


# Workflows (pgqueue.workflow re-exports these; ops/workflows returns them).
WorkflowStatus = Literal["running", "succeeded", "failed"]


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """An enqueued workflow: its id and each step's job id."""

    workflow_id: int
    jobs: dict[str, int]


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow as stored (``app.get_workflow``): ``status`` is ``running``
    until every step ended, then ``succeeded`` (all succeeded) or ``failed``."""

    workflow_id: int
    name: str
    status: WorkflowStatus
    created_at: datetime
    steps: dict[str, Job]
    after: dict[str, list[str]]
