"""The JobContext a task receives with ``pass_context=True``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pgqueue import durations, validation
from pgqueue.errors import InvalidOption

if TYPE_CHECKING:
    from pgqueue.models import JobStatus
    from pgqueue.worker.durable import DurableRun, DurableSource
    from pgqueue.worker.task_transaction import JobTransaction, TaskTransactions


@dataclass(slots=True, eq=False)
class JobContext:
    """What a running task may know and do about its own job.

    ``should_stop()`` turns true once the job is cancelled or the worker is
    shutting down; long tasks should check it and return early.
    ``extend(seconds)`` asks the worker to push this job's lease to now +
    seconds at once (the heartbeat does it; the call does not block).
    ``transaction()`` gives a connection whose transaction also records the
    job succeeded when it commits. ``set_progress(value)`` tells how far the
    job got; ``tags``, ``meta`` and ``group_key`` are what it was enqueued with.

    Durable tasks: ``step(name, fn, ...)`` runs ``fn`` once per job and stores
    its result; ``sleep(duration)`` / ``sleep_until(when)`` and
    ``wait_for_event(key)`` let the job leave the worker and come back. In an
    async task these are awaited; in a sync task they are plain calls.
    """

    job_id: int
    attempt: int
    attempt_id: int
    queue: str
    task: str
    tags: list[str] = field(default_factory=list)
    meta: dict[str, Any] | None = None
    #: The group (tenant, customer, ...) the job was enqueued with, or None.
    group_key: str | None = None
    #: The last value given to :meth:`set_progress` in this attempt.
    progress: Any = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _extend: Callable[[float], None] | None = field(default=None, repr=False)
    _transactions: TaskTransactions | None = field(default=None, repr=False)
    _progress: Callable[[str], None] | None = field(default=None, repr=False)
    #: Loads (workflow id, [(dependency name, status, result), ...]) once.
    _dependencies: Callable[[], tuple[int | None, list[tuple[str, str, Any]]]] | None = field(
        default=None, repr=False
    )
    _loaded: tuple[int | None, list[tuple[str, str, Any]]] | None = field(default=None, repr=False)
    #: Durable calls (step, sleep, wait_for_event): the worker's source, this
    #: run's state (made on the first call), and whether the task is async.
    _durable: DurableSource | None = field(default=None, repr=False)
    _run: DurableRun | None = field(default=None, repr=False)
    _is_async: bool = field(default=False, repr=False)

    def _durable_run(self) -> DurableRun:
        if self._run is None:
            if self._durable is None:
                raise InvalidOption(
                    "context.step(), sleep() and wait_for_event() are only available in a "
                    "worker (or pgqueue.testing.drain)"
                )
            self._run = self._durable.for_job(self.job_id, self.attempt_id)
        return self._run

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per job: its result (JSON) is stored
        before this returns, and every later run of the job (a retry, a wake-up)
        gets the stored result without calling ``fn``. A step that raises is not
        stored. Awaitable in an async task (``fn`` may be async there)::

            charge = await context.step("charge", charge_card, order_id)

        Each step of a run needs its own ``name`` (a name used twice is
        :class:`pgqueue.InvalidInput`); names, not counters, identify steps
        across runs. A reaped attempt cannot store a step
        (:class:`pgqueue.LeaseLost`)."""
        run = self._durable_run()
        if self._is_async:
            return run.step_async(name, fn, args, kwargs)
        return run.step_sync(name, fn, args, kwargs)

    def sleep(self, duration: float | timedelta | str, *, name: str | None = None) -> Any:
        """Sleep for ``duration`` (seconds, a timedelta, or text such as ``"3d"``)
        without holding a worker slot: the first time, the job goes back to the
        queue until then (outcome ``slept``, no attempt spent) and the task
        runs again from its top; on the runs after, this returns at once.
        ``name`` tells sleeps apart across runs (default: the n-th sleep of the
        run). Awaitable in an async task."""
        wake_at = datetime.now(UTC) + durations.parse_duration(duration)
        return self._sleep(wake_at, name)

    def sleep_until(self, when: datetime, *, name: str | None = None) -> Any:
        """:meth:`sleep` until the datetime ``when`` (naive: UTC)."""
        return self._sleep(validation.aware("when", when), name)

    def _sleep(self, wake_at: datetime, name: str | None) -> Any:
        run = self._durable_run()
        if self._is_async:
            return run.sleep_async(wake_at, name)
        return run.sleep_sync(wake_at, name)

    def wait_for_event(
        self,
        key: str,
        timeout: float | timedelta | str | None = None,
        *,
        name: str | None = None,
    ) -> Any:
        """The payload of the event ``key`` (``app.send_event(key, payload)``).
        Sent already: returned at once. Else the job waits (status
        ``waiting``, no worker slot) until the event is sent, and runs again
        from its top; after ``timeout`` (from the first wait) this raises
        :class:`pgqueue.EventTimeout`, which the task may catch. Awaitable in
        an async task. ``name`` (default ``"event:<key>"``) tells waits apart."""
        seconds = None
        if timeout is not None:
            seconds = durations.parse_duration(timeout).total_seconds()
        run = self._durable_run()
        if self._is_async:
            return run.wait_async(key, seconds, name)
        return run.wait_sync(key, seconds, name)

    def _graph(self) -> tuple[int | None, list[tuple[str, str, Any]]]:
        if self._loaded is None:
            self._loaded = (None, []) if self._dependencies is None else self._dependencies()
        return self._loaded

    @property
    def workflow_id(self) -> int | None:
        """The workflow this job is a step of (None for other jobs)."""
        return self._graph()[0]

    def dependency_results(self) -> dict[str, Any]:
        """Stored results of the direct dependencies that succeeded, by step
        name (the job id as text for a plain ``depends_on``)."""
        return {name: result for name, status, result in self._graph()[1] if status == "succeeded"}

    def dependency_statuses(self) -> dict[str, JobStatus]:
        """How each direct dependency ended (or where it is), by step name."""
        from pgqueue.models import JobStatus

        return {name: JobStatus(status) for name, status, _ in self._graph()[1]}

    def should_stop(self) -> bool:
        """True once the job was cancelled or the worker is shutting down."""
        return self._stop.is_set()

    def extend(self, seconds: float) -> None:
        """Ask for the lease to be extended to now + ``seconds``."""
        if self._extend is not None:
            self._extend(seconds)

    def set_progress(self, value: float | dict[str, Any]) -> None:
        """Store how far the job got: a number, or a JSON object of at most
        4 KiB (``Job.progress``). Written at most about once a second; the
        last value given before the attempt ends is always written."""
        text = validation.progress(value)
        self.progress = value
        if self._progress is not None:
            self._progress(text)

    def transaction(self) -> JobTransaction:
        """Complete the job in the task's own transaction::

            with context.transaction() as conn:          # async: async with
                conn.execute("INSERT INTO invoices ...")

        The block runs in a transaction on a pooled psycopg connection; when it
        ends normally the job is recorded succeeded in that same transaction,
        fenced by this attempt's id, and then it commits. If the lease was lost
        (the job was reaped) the block raises :class:`pgqueue.LeaseLost` and
        nothing it wrote commits; if the block raises, it rolls back and the job
        is retried as usual. Once committed, the task's return value and any
        later exception are not recorded (the job's result stays null). One
        block per attempt.
        """
        if self._transactions is None:
            raise InvalidOption("context.transaction() is only available in a worker")
        return self._transactions.open()

    def request_stop(self) -> None:
        """Set by the worker; tasks use :meth:`should_stop`."""
        self._stop.set()
