"""Exceptions raised by pgqueue.

Input errors are ``ValueError``/``TypeError`` subclasses and are raised before
anything is written. Connection and schema problems have their own classes so
callers can tell "fix your input" from "fix your database".
"""

from __future__ import annotations

from collections.abc import Sequence


class PgQueueError(Exception):
    """Base class of every pgqueue exception."""


# --- bad input -------------------------------------------------------------


class InvalidInput(PgQueueError, ValueError):
    """An argument was rejected; nothing was written."""


class InvalidName(InvalidInput):
    """A queue, task, schema or schedule name is empty or has forbidden characters."""


class InvalidPayload(InvalidInput):
    """A payload is not a JSON object, not serialisable, or too large."""


class PayloadTooLarge(InvalidPayload):
    """A payload's JSON encoding exceeds the App's ``max_payload_bytes``."""


class InvalidDuration(InvalidInput):
    """A duration or time could not be parsed or is out of range."""


class InvalidCron(InvalidInput):
    """A cron expression is not valid (5 or 6 fields)."""


class InvalidTimezone(InvalidInput):
    """A time zone is not a known IANA name."""


class InvalidOption(InvalidInput, TypeError):
    """An option has the wrong type or an impossible combination of values."""


# --- state -----------------------------------------------------------------


class JobNotFound(PgQueueError, LookupError):
    """No job with this id exists (neither live nor archived)."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class WorkflowNotFound(PgQueueError, LookupError):
    """No workflow with this id exists."""

    def __init__(self, workflow_id: int) -> None:
        super().__init__(f"workflow {workflow_id} does not exist")
        self.workflow_id = workflow_id


class InvalidJobState(PgQueueError):
    """The operation does not apply to the job in its current status."""


class DuplicateJob(InvalidJobState):
    """A live job with the same (queue, dedup_key) prevents the operation."""


class LeaseLost(PgQueueError):
    """The lease was reaped and possibly re-leased: this holder may not finish the job.

    ``job_ids`` lists the jobs whose leases were lost; nothing was changed for them.
    """

    def __init__(self, job_ids: Sequence[int]) -> None:
        ids = ", ".join(str(i) for i in job_ids)
        super().__init__(
            f"lease lost for job {ids}: the lease expired and the job was reclaimed; "
            "this attempt's outcome was not recorded"
        )
        self.job_ids = list(job_ids)


class JobFailed(PgQueueError):
    """``result()`` of a job that ended dead; carries its last error."""

    def __init__(self, job_id: int, status: str, last_error: str | None) -> None:
        super().__init__(f"job {job_id} ended {status}: {last_error or 'no error recorded'}")
        self.job_id = job_id
        self.status = status
        self.last_error = last_error


class JobCancelled(JobFailed):
    """``result()`` of a job that was cancelled."""


class ResultNotStored(PgQueueError):
    """The job succeeded but its return value could not be stored (not
    JSON-serialisable, or over ``max_result_bytes``); the message says why."""

    def __init__(self, job_id: int, reason: str) -> None:
        super().__init__(f"job {job_id} succeeded but its result was not stored: {reason}")
        self.job_id = job_id
        self.reason = reason


class ResultTimeout(PgQueueError, TimeoutError):
    """``result(timeout=...)`` gave up before the job finished."""


class EventTimeout(PgQueueError, TimeoutError):
    """``context.wait_for_event(key, timeout=...)``: the event was not sent in
    time. Raised in the task, which may catch it."""

    def __init__(self, key: str) -> None:
        super().__init__(f"event {key!r} was not sent before the wait's timeout")
        self.key = key


class ScheduleNotFound(PgQueueError, LookupError):
    """No schedule with this name exists."""


class ScheduleConflict(PgQueueError):
    """A schedule kept changing under a concurrent writer; try the call again."""


class DuplicateSchedule(InvalidInput):
    """A schedule with this name already exists (use replace)."""


# --- database --------------------------------------------------------------


class DatabaseError(PgQueueError):
    """PostgreSQL could not be used as required.

    ``sqlstate`` is the server's error code (None when the client lost the
    server or the problem was found before asking it); ``transient`` says
    whether the same call may succeed later unchanged (a timeout, a deadlock,
    a failover, a lost connection), as opposed to a problem someone must fix.
    """

    transient: bool = False

    def __init__(
        self, message: str, *, sqlstate: str | None = None, transient: bool | None = None
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        if transient is not None:
            self.transient = transient


class QueryFailed(DatabaseError):
    """The server refused or aborted a statement on a healthy connection:
    lock or statement timeout, deadlock, serialization failure, read-only
    transaction (after a failover), disk full, ... (see ``sqlstate`` and
    ``transient``)."""


class ConnectionFailed(DatabaseError, ConnectionError):
    """PostgreSQL could not be reached, refused the credentials, or went away."""

    transient = True


class SchemaNotMigrated(DatabaseError):
    """The pgqueue schema is missing or older than this version of pgqueue."""

    transient = False


class PermissionDenied(DatabaseError):
    """The database role lacks a privilege the operation needs (see ``pgqueue grant``)."""


class PoolExhausted(ConnectionFailed):
    """Every connection of the pool stayed busy for the whole wait timeout."""


class TaskNotFound(PgQueueError, LookupError):
    """No worker published a task of that name and it has no settings."""


class ListenUnavailable(PgQueueError):
    """LISTEN is not possible with this App's settings (a transaction-mode
    pooler without ``listen_dsn``): ``subscribe()`` cannot stream events."""
