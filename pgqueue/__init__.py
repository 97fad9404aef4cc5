"""pgqueue: a task queue for Python whose whole state lives in PostgreSQL.

>>> import pgqueue
>>> app = pgqueue.App(dsn="postgresql://localhost/app")
>>> @app.task(queue="mail", max_attempts=3)
... def send_email(to: str, subject: str) -> None: ...
>>> send_email.enqueue(to="a@b.c", subject="hi")   # doctest: +SKIP
Enqueued(job_id=1, created=True)
"""

from pgqueue.app import App
from pgqueue.context import JobContext

# Task registry, settings, statistics, workers.
from pgqueue.errors import (
    ConnectionFailed,
    DatabaseError,
    DuplicateJob,
    DuplicateSchedule,
    EventTimeout,
    InvalidCron,
    InvalidDuration,
    InvalidInput,
    InvalidJobState,
    InvalidName,
    InvalidOption,
    InvalidPayload,
    InvalidTimezone,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    ListenUnavailable,
    PayloadTooLarge,
    PermissionDenied,
    PgQueueError,
    PoolExhausted,
    QueryFailed,
    ResultNotStored,
    ResultTimeout,
    ScheduleConflict,
    ScheduleNotFound,
    SchemaNotMigrated,
    TaskNotFound,
    WorkflowNotFound,
)
from pgqueue.events import JobEvent
from pgqueue.health_report import HealthCheck, HealthReport
from pgqueue.middleware import Middleware
from pgqueue.models import (
    ArchiveLayout,
    Attempt,
    AttemptOutcome,
    Enqueued,
    Job,
    JobSpec,
    JobStatus,
    LeasedJob,
    Page,
    QueueMetrics,
    Replayed,
    Retention,
    RetentionPass,
    Schedule,
    StepRecord,
    TableVacuum,
    TaskInfo,
    TaskSettings,
    TaskStats,
    UnknownTaskJobs,
    WorkerInfo,
)
from pgqueue.retry import Backoff, Permanent, Retry, Snooze
from pgqueue.router import RoutedTask, Router
from pgqueue.task import Task
from pgqueue.telemetry.database_view import QueueView
from pgqueue.telemetry.doctor import Finding
from pgqueue.version import __version__
from pgqueue.workflow import Step, Workflow, WorkflowInfo, WorkflowRun

__all__ = [
    "App",
    "ArchiveLayout",
    "Attempt",
    "AttemptOutcome",
    "Backoff",
    "ConnectionFailed",
    "DatabaseError",
    "DuplicateJob",
    "DuplicateSchedule",
    "Enqueued",
    "EventTimeout",
    "Finding",
    "HealthCheck",
    "HealthReport",
    "InvalidCron",
    "InvalidDuration",
    "InvalidInput",
    "InvalidJobState",
    "InvalidName",
    "InvalidOption",
    "InvalidPayload",
    "InvalidTimezone",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobEvent",
    "JobFailed",
    "JobNotFound",
    "JobSpec",
    "JobStatus",
    "LeaseLost",
    "LeasedJob",
    "ListenUnavailable",
    "Page",
    "Replayed",
    "Retention",
    "RetentionPass",
    "PayloadTooLarge",
    "Middleware",
    "Permanent",
    "PermissionDenied",
    "PgQueueError",
    "PoolExhausted",
    "QueueMetrics",
    "QueryFailed",
    "QueueView",
    "ResultNotStored",
    "ResultTimeout",
    "ScheduleConflict",
    "Retry",
    "Snooze",
    "Step",
    "StepRecord",
    "Workflow",
    "WorkflowInfo",
    "WorkflowNotFound",
    "WorkflowRun",
    "Schedule",
    "ScheduleNotFound",
    "SchemaNotMigrated",
    "TableVacuum",
    "Task",
    "__version__",
    # Task registry, settings, statistics, workers, routing.
    "RoutedTask",
    "Router",
    "TaskInfo",
    "TaskNotFound",
    "TaskSettings",
    "TaskStats",
    "UnknownTaskJobs",
    "WorkerInfo",
]
