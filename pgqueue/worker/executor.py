"""Runs leased jobs: async tasks on the event loop, sync tasks in a thread pool
(or, with ``--pool process``, in child processes: :mod:`pgqueue.worker.process_pool`).

Each job's outcome (return value, Retry, Permanent, other exception, timeout,
cancel) is classified here and handed to the completer. ``running`` holds
every job whose attempt is not yet recorded in the database (executing, or
finished and waiting for the completer's flush): the heartbeat extends
exactly these. ``busy`` counts occupied slots; a sync task abandoned after
its timeout keeps its slot until its thread returns; a child past its
timeout is killed, and its slot frees when it is gone.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from pgqueue import middleware as mw
from pgqueue.context import JobContext
from pgqueue.models import AttemptOutcome, LeasedJob
from pgqueue.ops.consume import Failure, describe_error
from pgqueue.ops.tasks import PublishedTask
from pgqueue.payloads import UnstoredResult, encode_result
from pgqueue.retry import Permanent, Retry, Snooze
from pgqueue.telemetry.observer import NULL_OBSERVER, WorkerObserver
from pgqueue.worker.durable import Parked, SleepUntil

if TYPE_CHECKING:
    from pgqueue.middleware import Middleware
    from pgqueue.models import TaskSettings
    from pgqueue.worker.completer import Completer
    from pgqueue.worker.durable import DurableSource
    from pgqueue.worker.process_pool import ChildOutcome, ProcessPool
    from pgqueue.worker.progress import ProgressWriter
    from pgqueue.worker.task_transaction import TaskTransactions, TaskTransactionSource

log = structlog.get_logger("pgqueue.worker")


class RunnableTask(PublishedTask, Protocol):
    """What the worker uses of a registered task (a :class:`pgqueue.Task`):
    named here so that the worker imports nothing of the App above it."""

    @property
    def func(self) -> Callable[..., Any]: ...
    @property
    def is_async(self) -> bool: ...
    @property
    def pass_context(self) -> bool: ...


if sys.version_info >= (3, 12):

    def _start_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        # Eager: a task that does not await runs to completion right here,
        # without a trip through the event loop's ready queue.
        return asyncio.Task(coro, loop=loop, eager_start=True)

else:

    def _start_task(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        return loop.create_task(coro)


class RunningJob:
    """A leased job from lease until its attempt is recorded.

    Only what every job has is set per instance; the rest are class-level
    defaults until a job needs its own value (fewer stores per job than
    ``__slots__`` with every field set).
    """

    context: JobContext | None = None
    transactions: TaskTransactions | None = None  # the context's transaction(), if any
    handle: asyncio.Future[Any] | None = None
    timer: asyncio.TimerHandle | None = None
    timed_out = False
    cancel_requested = False
    lost = False
    extend_to: float | None = None
    extend_requests = 0  # counts context.extend() calls, see Heartbeat
    observed: Any = None  # the observer's per-job state (a span)
    entered = False  # an async task's wrapper has begun (see Executor._run_async)
    in_child = False  # a sync task sent to a child process (--pool process)
    # The child's context.transaction(): its COMMIT is under way (the worker
    # agreed), and then done (the attempt is recorded by it).
    child_committing = False
    child_completed = False
    cancel_at_entry = False
    # context.set_progress (see ProgressWriter): the value waiting to be
    # written, its timer, and when the last write went out (monotonic).
    progress_pending: str | None = None
    progress_timer: asyncio.TimerHandle | None = None
    progress_written = 0.0

    def __init__(
        self,
        job: LeasedJob,
        task: RunnableTask | None,
        leased_at: float,
        started: float | None = None,
    ) -> None:
        self.job = job
        self.task = task
        self.started = time.monotonic() if started is None else started
        # Measured from before the lease was requested: never later than the server's view.
        self.lease_deadline = leased_at + job.lease_seconds


#: A job's workflow id and direct dependencies (context.dependency_results).
Dependencies = Callable[[int], tuple[int | None, list[tuple[str, str, Any]]]]


def _nothing() -> None:
    pass


#: With ``--pool process``: seconds the producer's wake-up waits, after a
#: slot freed, for more slots to free (see Executor._release_child_slot).
COALESCE = 0.002


class Executor:
    """Starts jobs and turns their endings into completions.

    ``running`` is the table of jobs whose attempt is not yet recorded: the
    executor adds to it, the completer removes what it recorded, the
    heartbeat extends what is in it. ``live_settings`` are the operators'
    task settings (``pgqueue task set``), kept current by the worker's
    :class:`~pgqueue.worker.task_settings.LiveTaskSettings` (read, never
    changed here). ``unknown_task_grace``: seconds after enqueue during
    which a job of a task this worker does not know is handed back instead
    of dead-lettered. ``heartbeat_wake`` asks the heartbeat to extend leases
    now (``context.extend``)."""

    def __init__(
        self,
        tasks: Mapping[str, RunnableTask],
        concurrency: int,
        completer: Completer,
        max_result_bytes: int,
        *,
        running: dict[int, RunningJob],
        worker_id: str | None = None,
        transactions: TaskTransactionSource | None = None,
        observer: WorkerObserver = NULL_OBSERVER,
        progress: ProgressWriter | None = None,
        middleware: Sequence[Middleware] = (),
        dependencies: Dependencies | None = None,
        live_settings: Mapping[str, TaskSettings] | None = None,
        unknown_task_grace: float = 3600.0,
        heartbeat_wake: Callable[[], None] = _nothing,
        pool: ProcessPool | None = None,
        durable: DurableSource | None = None,
    ) -> None:
        self.pool = pool  # --pool process: sync tasks run in its children
        self.capacity_timer: asyncio.TimerHandle | None = None
        self.coalesce_slots = max(1, concurrency // 2)
        self.dependencies = dependencies
        self.durable = durable  # context.step, sleep, wait_for_event; None: unavailable
        self.worker_id = worker_id
        self.live_settings: Mapping[str, TaskSettings] = (
            {} if live_settings is None else live_settings
        )
        self.unknown_task_grace = unknown_task_grace
        self.heartbeat_wake = heartbeat_wake
        self.tasks = tasks
        self.middleware = tuple(middleware)
        self.progress = progress  # for context.set_progress; None: kept on the context only
        self.observer = observer
        self.observing = observer is not NULL_OBSERVER  # per-job hooks only when someone listens
        self.observe_starts = observer.observes_starts()
        self.concurrency = concurrency
        self.completer = completer
        self.running = running
        self.busy = 0
        self.capacity = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.threads = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="pgqueue-task"
        )
        self.threads_busy = 0  # sync tasks whose function has not returned yet
        self.loop = asyncio.get_running_loop()
        self.max_result_bytes = max_result_bytes
        self.transactions = transactions  # for context.transaction(); None: unavailable
        # Per-job lines are the hot path's only logging: decide once whether
        # their levels are enabled instead of building every call.
        self.jlog = log.bind()
        enabled = getattr(self.jlog, "is_enabled_for", None)
        self.log_starts = enabled(logging.DEBUG) if enabled else True
        self.log_successes = enabled(logging.INFO) if enabled else True

    def free(self) -> int:
        return self.concurrency - self.busy

    # --- start -----------------------------------------------------------------

    def start_many(self, jobs: list[LeasedJob], leased_at: float) -> None:
        """Start a leased batch (in lease order)."""
        if self.observing:
            self.observer.leased(jobs)
        started = time.monotonic()
        start = self.start
        for job in jobs:
            start(job, leased_at, started)

    def start(self, job: LeasedJob, leased_at: float, started: float | None = None) -> None:
        task = self.tasks.get(job.task)
        rj = RunningJob(job, task, leased_at, started)
        self.running[job.job_id] = rj
        if self.observe_starts:
            self.observer.started(rj)
        if task is None:
            # Handed back for a worker that knows the task (a rolling deploy);
            # dead-lettered only after the grace period (see fail_jobs, 0006).
            self._record_failure(
                rj,
                Failure(
                    job.job_id,
                    job.attempt_id,
                    AttemptOutcome.FAILED,
                    "unknown_task",
                    f"no task named {job.task!r} is registered in worker {self.worker_id or '?'}",
                    permanent=True,
                    unknown_task_grace=self.unknown_task_grace,
                ),
            )
            return
        if type(job.payload) is not dict:  # see payloads.loads_stored
            self._record_failure(
                rj,
                Failure(
                    job.job_id,
                    job.attempt_id,
                    AttemptOutcome.FAILED,
                    "invalid_payload",
                    f"cannot run task {job.task!r}: {job.payload}",
                    permanent=True,
                ),
            )
            return
        self.busy += 1
        if self.busy == 1:
            self.idle.clear()
        kwargs: dict[str, Any] = job.payload
        in_child = self.pool is not None and not task.is_async
        if not in_child and (task.pass_context or self.middleware):
            if self.transactions is not None:
                # Once its block commits the attempt is recorded: the job leaves ``running``.
                rj.transactions = self.transactions.for_job(
                    job, partial(self.loop.call_soon_threadsafe, self.running.pop, job.job_id, None)
                )
            rj.context = JobContext(
                job.job_id,
                job.attempt,
                job.attempt_id,
                job.queue,
                job.task,
                tags=job.tags or [],
                meta=job.meta,
                group_key=job.group_key,
                _extend=partial(self._request_extend, rj),
                _progress=None if self.progress is None else partial(self.progress.note, rj),
                _dependencies=None
                if self.dependencies is None
                else partial(self.dependencies, job.job_id),
                _transactions=rj.transactions,
                _durable=self.durable,
                _is_async=task.is_async,
            )
            if task.pass_context:
                kwargs = {**kwargs, "context": rj.context}
        # Timer, lease and log before the task starts: an eager task may end
        # (and _ended run) inside _start_task.
        live = self.live_settings.get(job.task) if self.live_settings else None
        timeout = live.timeout if live is not None and live.timeout is not None else task.timeout
        if timeout is not None:
            rj.timer = self.loop.call_later(timeout, self._on_timeout, rj)
        lease = live.lease_seconds if live is not None and live.lease_seconds else None
        if lease is None and job.lease_seconds != task.lease_seconds:
            # Enqueued by name by a producer that did not know the task (and
            # before any worker published it): apply this task's lease.
            rj.extend_to = float(task.lease_seconds)
            self.heartbeat_wake()
        if self.log_starts:
            self.jlog.debug(
                "job started",
                job_id=job.job_id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
            )
        if in_child:
            assert self.pool is not None
            # The child runs the middleware and builds the context; the
            # outcome comes back as its message (or its death).
            rj.in_child = True
            rj.handle = self.pool.submit(job, partial(self._child_message, rj))
            rj.handle.add_done_callback(partial(self._child_done, rj))
            return
        run_context = self.observer.run_context(rj) if self.observing else None
        if task.is_async:
            try:
                if self.middleware:
                    assert rj.context is not None
                    coro = mw.run_async(self.middleware, rj.context, partial(task.func, **kwargs))
                else:
                    coro = task.func(**kwargs)
            except BaseException as exc:
                self._ended(rj, None, exc)
                return
            # The wrapper records the ending itself: no done callback (and
            # its trip through the event loop) per job.
            run = self._run_async(rj, coro)
            rj.handle = (
                _start_task(self.loop, run)
                if run_context is None
                else run_context.run(_start_task, self.loop, run)
            )
        else:
            call = partial(task.func, **kwargs)
            if self.middleware:
                assert rj.context is not None
                call = partial(mw.run_sync, self.middleware, rj.context, call)
            if run_context is not None:
                call = partial(run_context.run, call)
            rj.handle = self.loop.run_in_executor(self.threads, call)
            rj.handle.add_done_callback(partial(self._sync_done, rj))
            self.threads_busy += 1

    async def _run_async(self, rj: RunningJob, coro: Any) -> None:
        rj.entered = True
        if rj.cancel_at_entry:  # cancelled before this task's first step
            coro.close()
            self._ended(rj, None, asyncio.CancelledError())
            return
        try:
            value = await coro
        except BaseException as exc:  # CancelledError included: a timeout or cancel
            self._ended(rj, None, exc)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
        else:
            self._ended(rj, value, None)

    def _cancel_async(self, rj: RunningJob) -> None:
        """Cancel an async job's task (the running coroutine gets CancelledError)."""
        if rj.handle is None or rj.handle.done():
            return
        if rj.entered:
            rj.handle.cancel()
        else:
            # Cancelling a task before its first step would throw into the
            # wrapper before its try: let the wrapper see the flag instead.
            rj.cancel_at_entry = True

    # --- endings ---------------------------------------------------------------

    def _sync_done(self, rj: RunningJob, handle: asyncio.Future[Any]) -> None:
        self.threads_busy -= 1
        if rj.timed_out:  # already recorded as a timeout; now the slot is free again
            self._release_slot()
            return
        if handle.cancelled():
            self._ended(rj, None, asyncio.CancelledError())
        else:
            exc = handle.exception()
            self._ended(rj, None if exc is not None else handle.result(), exc)

    def _child_message(self, rj: RunningJob, message: dict[str, Any]) -> None:
        """Progress, a lease extension or a step of ``context.transaction()``
        from the child running ``rj``."""
        op = message["op"]
        if op == "progress":
            if self.progress is not None:
                self.progress.note(rj, str(message["text"]))
        elif op == "extend":
            self._note_extend(rj, float(message["seconds"]))
        elif op == "committing":
            # From here the row may change under the heartbeat by this commit.
            allowed = not (rj.lost or rj.timed_out)
            rj.child_committing = allowed
            assert self.pool is not None
            self.pool.answer_commit(rj.job.job_id, allowed)
        elif op == "commit_failed":
            rj.child_committing = False
        elif op == "committed":
            rj.child_completed = True
            self.running.pop(rj.job.job_id, None)

    def _succeeded_in_transaction(self, rj: RunningJob, **extra: Any) -> None:
        """context.transaction() recorded the success with the task's writes."""
        job = rj.job
        self.running.pop(job.job_id, None)
        if self.log_successes:
            self.jlog.info(
                "job succeeded in its transaction",
                job_id=job.job_id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
                duration_ms=_ms_since(rj.started),
                outcome="succeeded",
                **extra,
            )

    def _discard_lost(self, rj: RunningJob, exc: BaseException | None) -> None:
        """The job ended after its lease was lost: its outcome is not ours to record."""
        job = rj.job
        self.running.pop(job.job_id, None)
        log.warning(
            "job finished after its lease was lost; outcome discarded",
            job_id=job.job_id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempt,
        )
        self.observer.finished(rj, "lease_lost", exc)

    def _parked(self, rj: RunningJob, key: str) -> None:
        """wait_for_event set the job waiting in the database: nothing to record."""
        job = rj.job
        self.running.pop(job.job_id, None)
        self.jlog.info(
            "job waits for an event",
            job_id=job.job_id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempt,
            event_key=key,
        )
        self.observer.finished(rj, AttemptOutcome.WAITED.value, None)

    def _child_done(self, rj: RunningJob, handle: asyncio.Future[ChildOutcome]) -> None:
        """The child answered for ``rj``, or died running it."""
        if rj.timed_out:  # already recorded as a timeout; the child is gone, the slot free
            self._release_slot()
            return
        if rj.timer is not None:
            rj.timer.cancel()
            rj.timer = None
        if rj.progress_timer is not None and self.progress is not None:
            self.progress.flush(rj)
        self._release_slot()
        job = rj.job
        if rj.child_completed:
            self._succeeded_in_transaction(rj)
            return
        if rj.lost:
            self._discard_lost(rj, None)
            return
        outcome = handle.result()
        message = outcome.message
        if outcome.handed_back:  # no child could take it: back to the queue
            self.running.pop(job.job_id, None)
            self.completer.nack([rj])
            self.observer.finished(rj, "released", None)
            log.warning(
                "no child process can run the job; handing it back",
                job_id=job.job_id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
            )
            return
        if message is None:
            if rj.cancel_requested:
                failure = Failure(
                    job.job_id,
                    job.attempt_id,
                    AttemptOutcome.CANCELLED,
                    "cancelled",
                    "cancelled while running: the child process was stopped",
                )
            else:
                failure = Failure(
                    job.job_id,
                    job.attempt_id,
                    AttemptOutcome.FAILED,
                    "worker_crashed",
                    f"{outcome.death()} while running task {job.task!r}",
                )
            self._record_failure(rj, failure, _ms_since(rj.started))
            return
        suspend = message.get("suspend")
        if suspend is not None:  # a durable task in the child slept or waits for an event
            if "event" in suspend:
                self._parked(rj, str(suspend["event"]))
            else:
                wake_at = datetime.fromisoformat(suspend["sleep_until"])
                self._record_failure(
                    rj, slept(job.job_id, job.attempt_id, wake_at), _ms_since(rj.started)
                )
            return
        failed = message.get("failure")
        if failed is not None:
            failure = Failure(
                job.job_id,
                job.attempt_id,
                AttemptOutcome(failed["outcome"]),
                str(failed["code"]),
                str(failed["message"]),
                failed.get("trace"),
                retry_delay=failed.get("delay"),
                permanent=bool(failed.get("permanent")),
            )
            self._record_failure(rj, failure, _ms_since(rj.started))
            return
        result: str | None = message.get("result")
        unstored = message.get("unstored")
        if unstored is not None:
            result = UnstoredResult(unstored)
            self.jlog.warning(
                "job succeeded but its result was not stored",
                job_id=job.job_id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
                reason=unstored,
            )
        self.completer.ack(rj, result)
        if self.log_successes or self.observing:
            self._succeeded(rj)

    def _on_timeout(self, rj: RunningJob) -> None:
        rj.timer = None
        if rj.handle is None or rj.handle.done() or _completed_in_transaction(rj):
            return
        if rj.child_committing:
            return  # its transaction is recording the success
        rj.timed_out = True
        if rj.in_child:
            # A hard limit: the child is stopped; the slot frees when it is gone.
            assert self.pool is not None
            self.pool.kill_job(rj.job.job_id, "timeout")
            self._record_failure(rj, self._timeout_failure(rj))
            return
        if rj.task is not None and rj.task.is_async:
            self._cancel_async(rj)  # _run_async records the timeout
            return
        # A thread cannot be stopped: record the timeout now, keep the slot
        # busy until the function returns (see _sync_done).
        if rj.context is not None:
            rj.context.request_stop()
        self._record_failure(rj, self._timeout_failure(rj))

    def _timeout_failure(self, rj: RunningJob) -> Failure:
        live = self.live_settings.get(rj.job.task)
        timeout = live.timeout if live is not None and live.timeout is not None else None
        if timeout is None:
            timeout = rj.task.timeout if rj.task is not None else None
        return Failure(
            rj.job.job_id,
            rj.job.attempt_id,
            AttemptOutcome.TIMEOUT,
            "timeout",
            f"task {rj.job.task!r} exceeded its timeout of {timeout:g}s",
        )

    def _ended(self, rj: RunningJob, value: Any, exc: BaseException | None) -> None:
        if rj.timer is not None:
            rj.timer.cancel()
            rj.timer = None
        if rj.progress_timer is not None and self.progress is not None:
            self.progress.flush(rj)
        self._release_slot()
        job = rj.job
        if value is None and exc is None and rj.context is None and not rj.lost:
            # The usual ending (no result, no context.transaction()): straight to the completer.
            self.completer.ack(rj, None)
            if self.log_successes or self.observing:
                self._succeeded(rj)
            return
        if _completed_in_transaction(rj):
            self._succeeded_in_transaction(rj, error=None if exc is None else repr(exc))
            return
        if isinstance(exc, Parked):
            self._parked(rj, exc.key)
            return
        if rj.lost:
            self._discard_lost(rj, exc)
            return
        if exc is None:
            encoded = encode_result(value, self.max_result_bytes)
            if isinstance(encoded, UnstoredResult):
                self.jlog.warning(
                    "job succeeded but its result was not stored",
                    job_id=job.job_id,
                    task=job.task,
                    queue=job.queue,
                    attempt=job.attempt,
                    reason=str(encoded),
                )
            self.completer.ack(rj, encoded)
            self._succeeded(rj)
            return
        self._record_failure(rj, self._classify(rj, exc), _ms_since(rj.started), exc)

    def _succeeded(self, rj: RunningJob) -> None:
        """Log and observe a success the completer has been handed."""
        if self.log_successes:
            job = rj.job
            self.jlog.info(
                "job succeeded",
                job_id=job.job_id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
                duration_ms=_ms_since(rj.started),
                outcome="succeeded",
            )
        if self.observing:
            self.observer.finished(rj, "succeeded", None)

    def _classify(self, rj: RunningJob, exc: BaseException) -> Failure:
        job = rj.job
        if isinstance(exc, asyncio.CancelledError):
            if rj.timed_out:
                return self._timeout_failure(rj)
            if rj.cancel_requested:
                return Failure(
                    job.job_id,
                    job.attempt_id,
                    AttemptOutcome.CANCELLED,
                    "cancelled",
                    "cancelled while running",
                )
        if isinstance(exc, SleepUntil):
            return slept(job.job_id, job.attempt_id, exc.wake_at)
        return failure_of(job.job_id, job.attempt_id, classify_exception(exc, rj.task, job.payload))

    def _record_failure(
        self,
        rj: RunningJob,
        failure: Failure,
        duration_ms: float | None = None,
        error: BaseException | None = None,
    ) -> None:
        job = rj.job
        self.completer.fail(rj, failure)
        if failure.outcome is AttemptOutcome.SNOOZED or failure.outcome is AttemptOutcome.SLEPT:
            self.jlog.info(
                "job snoozed" if failure.outcome is AttemptOutcome.SNOOZED else "job sleeps",
                job_id=job.job_id,
                task=job.task,
                queue=job.queue,
                attempt=job.attempt,
                delay=failure.retry_delay,
            )
            self.observer.finished(rj, failure.outcome.value, None)
            return
        log.warning(
            "job failed",
            job_id=job.job_id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempt,
            duration_ms=duration_ms,
            outcome=failure.outcome.value,
            error_code=failure.error_code,
            error=failure.error_message,
            permanent=failure.permanent,
        )
        self.observer.finished(rj, failure.outcome.value, error)

    def _release_slot(self) -> None:
        self.busy -= 1
        if self.pool is not None:
            self._release_child_slot()
        # Only the producer waits for capacity, and only once every slot is
        # taken: the slot that ends a full house wakes it (not every slot).
        elif self.busy >= self.concurrency - 1:
            self.capacity.set()
        if self.busy == 0:
            self.idle.set()

    def _release_child_slot(self) -> None:
        """Children answer one by one, each a little later than a thread would:
        a lease per freed slot would cost a round trip per job. The producer
        is woken once half the slots are free, else ``COALESCE`` seconds
        after the first one freed, to lease what freed meanwhile in one go."""
        if self.concurrency - self.busy >= self.coalesce_slots or self.busy == 0:
            self.capacity.set()
        elif self.capacity_timer is None:
            self.capacity_timer = self.loop.call_later(COALESCE, self._capacity_now)

    def _capacity_now(self) -> None:
        self.capacity_timer = None
        self.capacity.set()

    # --- requests from outside ---------------------------------------------------

    def _request_extend(self, rj: RunningJob, seconds: float) -> None:
        """JobContext.extend: may be called from a task's thread."""
        self.loop.call_soon_threadsafe(self._note_extend, rj, float(seconds))

    def _note_extend(self, rj: RunningJob, seconds: float) -> None:
        rj.extend_to = seconds
        rj.extend_requests += 1
        self.heartbeat_wake()

    def cancel(self, job_id: int) -> None:
        """A cancel was requested for a job: tell the task to stop."""
        rj = self.running.get(job_id)
        if rj is None or rj.cancel_requested:
            return
        rj.cancel_requested = True
        if rj.context is not None:
            rj.context.request_stop()
        if rj.task is not None and rj.task.is_async:
            self._cancel_async(rj)
        if rj.in_child and self.pool is not None:
            # should_stop() now; a child still running after the grace is stopped.
            self.pool.stop_job(job_id)
            self.loop.call_later(self.pool.kill_grace, self._stop_cancelled_child, rj)
        log.info(
            "cancel requested for running job",
            job_id=job_id,
            task=rj.job.task,
            queue=rj.job.queue,
            attempt=rj.job.attempt,
        )

    def _stop_cancelled_child(self, rj: RunningJob) -> None:
        """The kill grace after a cancel passed: stop the child if it still runs the job."""
        if self.pool is None or rj.handle is None or rj.handle.done() or rj.child_committing:
            return
        self.pool.kill_job(rj.job.job_id, "cancel")

    def lose(self, job_id: int, attempt_id: int | None = None) -> None:
        """The lease of ``attempt_id`` (None: whichever runs) was refused
        (reaped): stop treating the job as ours. A newer attempt of the same
        job, leased again by this worker meanwhile, is left alone."""
        rj = self.running.get(job_id)
        if rj is None or _completing_in_transaction(rj) or rj.child_committing:
            return  # the row changed because context.transaction() recorded the job
        if attempt_id is not None and rj.job.attempt_id != attempt_id:
            return
        del self.running[job_id]
        rj.lost = True
        if rj.context is not None:
            rj.context.request_stop()
        if rj.task is not None and rj.task.is_async:
            self._cancel_async(rj)
        if rj.in_child and self.pool is not None:
            self.pool.kill_job(job_id, "lease_lost")
        log.error(
            "lease lost: the job was reclaimed while this worker ran it",
            job_id=job_id,
            task=rj.job.task,
            queue=rj.job.queue,
            attempt=rj.job.attempt,
        )

    def stop_all(self) -> None:
        """Shutdown: every running task's ``should_stop()`` turns true."""
        for rj in self.running.values():
            if rj.context is not None:
                rj.context.request_stop()
        if self.pool is not None:
            self.pool.stop_all()

    def unfinished(self) -> list[RunningJob]:
        """Jobs still executing (not yet handed to the completer)."""
        return [
            rj
            for rj in self.running.values()
            if rj.handle is not None and not rj.handle.done() and not rj.timed_out
        ]

    def abandon(self, rjs: list[RunningJob]) -> None:
        """Shutdown timeout: stop waiting for these; their outcomes are discarded."""
        for rj in rjs:
            rj.lost = True
            self.running.pop(rj.job.job_id, None)
            self.observer.finished(rj, "released", None)
            if rj.task is not None and rj.task.is_async:
                self._cancel_async(rj)
            if rj.in_child and self.pool is not None:
                self.pool.kill_job(rj.job.job_id, "shutdown")

    async def start_pool(self) -> None:
        """Start the child processes (``--pool process``) before any lease."""
        if self.pool is not None:
            await self.pool.start()

    async def close_pool(self) -> None:
        """Stop every child process; none outlives the worker."""
        if self.pool is not None:
            await self.pool.close()

    def close(self) -> int:
        """Release the thread pool; returns how many sync tasks are still running
        (abandoned after a timeout or handed back at shutdown)."""
        self.threads.shutdown(wait=False, cancel_futures=True)
        return self.threads_busy


#: How a task's exception is recorded: the fields of a Failure after its ids.
Classified = tuple[AttemptOutcome, str, str, str | None, float | None, bool]


def classify_exception(
    exc: BaseException, task: RunnableTask | None, payload: dict[str, Any]
) -> Classified:
    """(outcome, error code, message, traceback, retry delay, permanent) of a
    task's exception: in the worker, and in a ``--pool process`` child."""
    if isinstance(exc, Snooze | Retry):
        # Again after exc.delay; a snooze does not spend the attempt (fail_jobs).
        outcome = AttemptOutcome.SNOOZED if isinstance(exc, Snooze) else AttemptOutcome.RETRY
        return outcome, outcome.value, str(exc), None, exc.delay, False
    code, message, trace = describe_error(exc)
    if isinstance(exc, Permanent):
        return AttemptOutcome.FAILED, code, message, trace, None, True
    if isinstance(exc, TypeError) and task is not None and not _accepts(task, payload):
        return (
            AttemptOutcome.FAILED,
            "invalid_payload",
            f"payload does not match the parameters of task {task.name!r}: {message}",
            trace,
            None,
            True,
        )
    return AttemptOutcome.FAILED, code, message, trace, None, False


def slept(job_id: int, attempt_id: int, wake_at: datetime) -> Failure:
    """context.sleep: queued again at the wake-up time, the attempt not spent."""
    return Failure(
        job_id,
        attempt_id,
        AttemptOutcome.SLEPT,
        AttemptOutcome.SLEPT.value,
        f"sleeping until {wake_at.isoformat()}",
        retry_at=wake_at,
    )


def failure_of(job_id: int, attempt_id: int, classified: Classified) -> Failure:
    """The Failure to record for a classified exception."""
    outcome, code, message, trace, delay, permanent = classified
    return Failure(
        job_id,
        attempt_id,
        outcome,
        code,
        message,
        trace,
        retry_delay=delay,
        permanent=permanent,
    )


def _completed_in_transaction(rj: RunningJob) -> bool:
    tx = rj.transactions
    return tx is not None and tx.completed


def _completing_in_transaction(rj: RunningJob) -> bool:
    tx = rj.transactions
    return tx is not None and (tx.committing or tx.completed)


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)


def _accepts(task: RunnableTask, payload: dict[str, Any]) -> bool:
    """Whether the task's signature accepts the payload (checked only after a TypeError)."""
    kwargs = dict(payload)
    if task.pass_context:
        kwargs["context"] = None
    try:
        inspect.signature(task.func).bind(**kwargs)
    except TypeError:
        return False
    return True
