# Generated from pgqueue/app_async.py by tools/async_to_sync.py: do not edit.
# Change pgqueue/app_async.py, then run `python tools/async_to_sync.py`.
"""App's operations, async: the one source of the sync ones.

Each method is one line over the same operation in :mod:`pgqueue.ops`, run
by the App's :class:`~pgqueue.database.Database`. ``tools/async_to_sync.py``
writes the sync class from this one (each name loses its async suffix, and
``await`` goes): edit here, then run it. :class:`pgqueue.App` inherits both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Unpack

import psycopg

from pgqueue import health_report
from pgqueue._adapters import ConnectionLike, sync_connection
from pgqueue.app_base import Age, AppBase, storable_result, task_options
from pgqueue.errors import ConnectionFailed, DatabaseError
from pgqueue.health_report import HealthReport, HealthSettings
from pgqueue.models import (
    ArchiveLayout,
    Enqueued,
    EnqueueOptions,
    Job,
    JobSpec,
    JobStatus,
    LeasedJob,
    Page,
    QueueMetrics,
    Replayed,
    Retention,
    Schedule,
    TableVacuum,
    TaskInfo,
    TaskStats,
    UnknownTaskJobs,
    WorkerInfo,
)
from pgqueue.ops import (
    admin,
    consume,
    dashboard,
    durable,
    enqueue,
    inspect,
    maintenance,
    operator,
    partitions,
    retention,
    schedules,
    workflows,
)
from pgqueue.ops import health as health_ops
from pgqueue.ops import tasks as task_ops
from pgqueue.ops.dashboard import DeadGroup, QueueRow, Throughput
from pgqueue.ops.inspect import JobFilter, JobPage
from pgqueue.retry import Backoff
from pgqueue.telemetry import database_view, doctor
from pgqueue.telemetry.database_view import QueueView
from pgqueue.telemetry.doctor import Finding
from pgqueue.workflow import Workflow, WorkflowInfo, WorkflowRun


class AppOperations(AppBase):
    """The operations of :class:`pgqueue.App`, one method each."""

    # --- enqueue -------------------------------------------------------------

    def enqueue(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        conn: ConnectionLike | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """Enqueue one job by task name (the task need not be registered here);
        in ``conn``'s transaction when given (a psycopg connection, a SQLAlchemy
        Connection/Session, or Django's connection). ``options``: the fields of
        :class:`JobSpec` (``queue``, ``priority``, ``run_at``, ``delay``,
        ``max_attempts``, ``dedup_key``, ``serial_key``, ...). ``dedup_window``:
        no new job if one with this dedup_key was created within that many
        seconds; ``debounce``: postpone and update the queued job holding the
        key. ``tags`` (up to 16 labels) and ``meta`` (a JSON object up to 8 KiB)
        are stored with the job. ``depends_on``: ids of jobs this one waits for
        (status ``waiting``) until they succeeded; with ``allow_failed`` until
        they ended, whatever their end."""
        return self.enqueue_spec(JobSpec(task, payload, **options), conn=conn)

    def enqueue_spec(self, spec: JobSpec, *, conn: ConnectionLike | None = None) -> Enqueued:
        """Enqueue one :class:`JobSpec` (what :meth:`enqueue` and ``task.enqueue`` call)."""
        return self._database.run(enqueue.enqueue_one(self.op_context, spec), sync_connection(conn))

    def enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: ConnectionLike | None = None
    ) -> list[Enqueued]:
        """Enqueue many jobs in one statement and one transaction (all or
        nothing); dedup hits return the live job's id, in input order."""
        return self._database.run(
            enqueue.enqueue_many(self.op_context, specs), sync_connection(conn)
        )

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a transaction, to pass as ``conn=`` to calls
        that must commit together (``pgqueue enqueue --file`` uses it): it
        commits when the block ends, and rolls back on an exception."""
        pool = self._database.pool()
        with pool.connection() as conn, conn.transaction():
            yield conn

    # --- workflows -------------------------------------------------------------

    def send_event(
        self, key: str, payload: Any = None, *, conn: ConnectionLike | None = None
    ) -> int:
        """Send the event ``key`` with a JSON ``payload``: stored (kept as long
        as cancelled jobs) and every job waiting for it in
        ``context.wait_for_event(key)`` is released, in ``conn``'s transaction
        when given (nothing happens if it rolls back). A job that waits for
        ``key`` later gets it at once; sending a key again replaces its
        payload. Returns how many waiting jobs it released."""
        return self._database.run(
            durable.send_event(key, payload, self.max_payload_bytes),
            sync_connection(conn),
        )

    def enqueue_workflow(
        self, workflow: Workflow, *, conn: ConnectionLike | None = None
    ) -> WorkflowRun:
        """Write ``workflow``'s steps (what :meth:`Workflow.enqueue` calls)."""
        return self._database.run(
            workflows.enqueue_workflow(self.op_context, workflow), sync_connection(conn)
        )

    def get_workflow(self, workflow_id: int) -> WorkflowInfo:
        """A workflow with each step's job and what it waits for."""
        return self._database.run(workflows.get_workflow(workflow_id))

    def cancel_workflow(self, workflow_id: int) -> int:
        """Cancel the workflow's live steps (running ones are asked to stop);
        returns how many were cancelled or asked to stop."""
        return self._database.run(workflows.cancel_workflow(workflow_id))

    def list_workflows(
        self, status: str | None = None, limit: int = 50, *, name: str | None = None
    ) -> list[WorkflowInfo]:
        """Workflows, newest first (``status``: running, succeeded or failed;
        ``name``: only the workflows of that name)."""
        return self._database.run(workflows.list_workflows(status, limit, name))

    # --- low-level consumer API ----------------------------------------------

    def lease(
        self,
        queue: str | Sequence[str] | None,
        worker_id: str,
        max: int = 1,
        lease_seconds: float | None = None,
    ) -> list[LeasedJob]:
        """Lease up to ``max`` ready jobs of ``queue`` (a name, names, or None
        for every queue), highest priority first, then by run_at and id;
        ``lease_seconds`` overrides the jobs' own."""
        return self._database.run(
            consume.lease(self.op_context, queue, worker_id, max, lease_seconds)
        )

    def ack(self, leased: LeasedJob, result: Any = None) -> None:
        """Mark a leased job succeeded, storing ``result`` (JSON, with the
        encoding of :func:`pgqueue.payloads.encode_result`). Raises LeaseLost,
        changing nothing, when this lease is no longer valid, and
        InvalidPayload, changing nothing, for a result that cannot be stored."""
        value = storable_result(result, self.max_result_bytes)
        self._database.run(consume.ack_many(self.op_context, [leased], [value]))

    def ack_many(self, leased: Sequence[LeasedJob]) -> None:
        """Ack many jobs in one statement; LeaseLost names any that were stale
        (the others are acked)."""
        self._database.run(consume.ack_many(self.op_context, leased))

    def fail(
        self,
        leased: LeasedJob,
        error: BaseException | str,
        retry_at: datetime | None = None,
        permanent: bool = False,
    ) -> JobStatus:
        """Record a failed attempt: retry at ``retry_at`` or after the job's
        backoff, or dead-letter when ``permanent`` or out of attempts. Returns
        the job's new status; raises LeaseLost for a stale lease."""
        return JobStatus(
            self._database.run(consume.fail(self.op_context, leased, error, retry_at, permanent))
        )

    def nack(self, leased: LeasedJob) -> None:
        """Hand a leased job back to its queue now, unrun (the attempt is
        recorded as ``released`` and does not count)."""
        self._database.run(consume.nack_many(self.op_context, [leased]))

    def extend(self, leased: LeasedJob, seconds: float) -> bool:
        """Extend the lease to now + ``seconds``; False when the lease is lost."""
        return self._database.run(consume.extend(self.op_context, leased, seconds))

    # --- inspection ------------------------------------------------------------

    def get_job(self, job_id: int, history: bool = False) -> Job:
        """A job by id (live or archived); ``history=True`` loads every attempt."""
        return self._database.run(inspect.get_job(job_id, history))

    def list_jobs(
        self,
        queue: str | None = None,
        status: str | JobStatus | None = None,
        task: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        *,
        tags: Sequence[str] | None = None,
        group_key: str | None = None,
    ) -> Page:
        """A page of jobs, newest first; pass ``page.next_cursor`` for the next one.
        ``tags``: only jobs having every one of them; ``group_key``: only that
        group's jobs."""
        return self._database.run(
            inspect.list_jobs(queue, status, task, limit, cursor, tags, group_key)
        )

    def metrics(self, queue: str | None = None) -> dict[str, QueueMetrics]:
        """Counts per queue: queued, scheduled, running, succeeded (last hour),
        dead, cancelled, oldest ready age, paused."""
        return self._database.run(inspect.metrics(queue))

    def explain(self, job_id: int) -> str:
        """Why a job is where it is, in plain words."""
        return self._database.run(inspect.explain(job_id))

    def result(self, job_id: int, timeout: float | None = None) -> Any:
        """The job's stored return value, waiting (via NOTIFY, or polling when
        the App has ``listen=False``) until it finishes; no pooled connection
        is held while waiting. Raises JobFailed (dead), JobCancelled,
        ResultTimeout, or ResultNotStored (it succeeded, but its return value
        could not be stored)."""
        return self._database.run_released(self._result_op(job_id, timeout))

    # --- the dashboard's reads (bounded; see pgqueue.ops.dashboard) ---------------

    def job_page(self, flt: JobFilter, cursor: str | None = None, limit: int = 50) -> JobPage:
        """A page of the jobs ``flt`` matches as the dashboard lists them: the
        statements of :meth:`list_jobs`, finished statuses in the order of
        their finish, free text searched over a bounded window of ids."""
        return self._database.run(inspect.job_page(flt, cursor, limit))

    def queue_rows(self, finished: bool = True) -> list[QueueRow]:
        """Every queue's counts as :meth:`metrics` counts them, saying which
        are capped or estimated; ``finished=False``: the live counts only."""
        return self._database.run(dashboard.queue_rows(finished))

    def throughput(
        self,
        per_minute: int = dashboard.THROUGHPUT_PER_MINUTE,
        hour_cap: int = dashboard.THROUGHPUT_HOUR_CAP,
    ) -> Throughput:
        """Jobs finished in each of the last 60 minutes and in the hour, exact
        up to ``per_minute`` a minute and ``hour_cap`` an hour, estimated past."""
        return self._database.run(dashboard.throughput(per_minute, hour_cap))

    def dead_groups(
        self, sample: int = dashboard.DEAD_GROUP_SAMPLE
    ) -> tuple[list[DeadGroup], bool]:
        """The newest ``sample`` dead jobs grouped by task, error code and
        message fingerprint; True when the sample was full."""
        return self._database.run(dashboard.dead_groups(sample))

    def dead_group_batch(
        self, group: tuple[str, str, str], cursor: tuple[datetime, int] | None, scan: int
    ) -> tuple[list[int], tuple[datetime, int] | None]:
        """The ids of one dead-letter group among the next ``scan`` dead jobs
        of its task, and the cursor after them (None: no more)."""
        return self._database.run(dashboard.dead_group_batch(group, cursor, scan))

    def change_mark(self) -> tuple[Any, ...]:
        """A tuple that changes whenever jobs, queues or workers change."""
        return self._database.run(dashboard.change_mark())

    # --- administration ----------------------------------------------------------

    def cancel(self, job_id: int) -> JobStatus:
        """Cancel a job: queued or scheduled ones end ``cancelled`` now (returns
        cancelled); a running one is asked to stop and ends cancelled when its
        attempt ends (returns running). Cancelling a finished job is an error."""
        return self._database.run(operator.cancel(job_id))

    def cancel_many(
        self,
        job_ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        statuses: Sequence[str] = ("queued", "scheduled"),
        limit: int = 1000,
    ) -> list[int]:
        """Cancel up to ``limit`` live jobs in one short statement, chosen by
        ``job_ids`` and/or the filters (``statuses``: queued, scheduled,
        running; running ones are asked to stop); returns the ids. Call again
        until it returns fewer than ``limit``."""
        params = operator.cancel_params(job_ids, queue, task, statuses, limit)
        return [r[0] for r in self._database.run(operator.cancel_batch(params))]

    def count_cancellable(
        self,
        *,
        queue: str | None = None,
        task: str | None = None,
        statuses: Sequence[str] = ("queued", "scheduled"),
    ) -> int:
        """How many live jobs :meth:`cancel_many` with these filters would
        cancel (or ask to stop) now, counted in one statement."""
        params = operator.cancel_params(None, queue, task, statuses)
        return self._database.run(operator.count_cancellable(params))

    def job_statuses(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The status of each of these jobs that exists (live or archived),
        by id, in one statement; ids of no job are left out."""
        return self._database.run(operator.job_statuses(job_ids))

    def list_queues(self) -> list[str]:
        """The name of every queue the database knows, sorted."""
        return self._database.run(operator.queue_names())

    def schema_summary(self) -> dict[str, int]:
        """What :meth:`uninstall` would drop: ``jobs``, ``archived_jobs``,
        ``live_jobs`` (queued or running) and ``live_workers``."""
        return self._database.run(operator.schema_summary())

    def uninstall(self) -> None:
        """Drop this App's schema with every job, schedule and setting in it
        (what ``pgqueue uninstall`` does after its checks); cannot be undone."""
        self._database.run(operator.drop_schema())
        self._database.close()

    def delete_queue(self, queue: str) -> None:
        """Delete a queue and its settings (pause, limits); refused with
        InvalidJobState while it holds live or dead jobs."""
        self._database.run(operator.delete_queue(queue))

    def replay(
        self, job_id: int, queue: str | None = None, run_at: datetime | None = None
    ) -> Replayed:
        """Enqueue a copy of any job (e.g. a succeeded or dead one); returns
        the new id as a :class:`Replayed` (an int with ``job_id`` and
        ``replayed_from``, the fields of ``pgqueue jobs replay --json``).
        An admin action: a producer or worker role gets PermissionDenied."""
        op = admin.replay(job_id, queue, run_at, schema=self.schema)
        return Replayed(self._database.run(op), job_id)

    def requeue_dead(self, job_id: int) -> None:
        """Put a dead job back in its queue (with one more attempt if needed)."""
        self._database.run(admin.requeue_dead(job_id))

    def requeue_dead_many(
        self,
        job_ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        task: str | None = None,
        limit: int = 1000,
    ) -> list[int]:
        """Requeue up to ``limit`` dead jobs in one short statement, chosen by
        ``job_ids`` or else by the queue/task filters; returns the ids requeued.
        Call again until it returns fewer than ``limit``. Jobs whose dedup key
        is live again are skipped."""
        return self._database.run(admin.requeue_dead_batch(job_ids, queue, task, limit))

    def count_dead(self, queue: str | None = None, task: str | None = None) -> int:
        """How many dead jobs match the filters."""
        return self._database.run(admin.count_dead(queue, task))

    def pause_queue(self, queue: str) -> None:
        """Stop every worker from leasing jobs of ``queue`` (enqueue still works)."""
        self._database.run(admin.set_paused(queue, True))

    def resume_queue(self, queue: str) -> None:
        """Let workers lease jobs of ``queue`` again."""
        self._database.run(admin.set_paused(queue, False))

    def set_queue_limit(
        self, queue: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Limit ``queue`` across all workers: at most ``concurrency`` jobs
        running, at most ``rate`` (e.g. ``"100/1m"``) lease starts per sliding
        window. None lifts that limit."""
        self._database.run(admin.set_limits(queue, concurrency, rate))

    # --- schedules ---------------------------------------------------------------

    def add_schedule(
        self,
        name: str,
        cron: str,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        timezone: str = "UTC",
        priority: int | None = None,
        max_attempts: int | None = None,
        enabled: bool = True,
        replace: bool = True,
    ) -> Schedule:
        """Create or update the cron schedule ``name`` (``replace=False``: raise
        DuplicateSchedule instead of updating). ``cron`` has 5 fields, or 6 with
        seconds last (croniter's order); fire times follow ``timezone``'s DST.
        ``queue``, ``priority`` and ``max_attempts`` left None take the task's
        defaults when the job is enqueued. Each job's run_at is its fire time."""
        return self._database.run(
            schedules.add_schedule(
                self.op_context,
                name,
                cron,
                task,
                payload,
                queue=queue,
                timezone=timezone,
                priority=priority,
                max_attempts=max_attempts,
                enabled=enabled,
                replace=replace,
            )
        )

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        return self._database.run(schedules.list_schedules())

    def get_schedule(self, name: str) -> Schedule:
        """One schedule by name; raises ScheduleNotFound."""
        return self._database.run(schedules.get_schedule(name))

    def enable_schedule(self, name: str) -> Schedule:
        """Enable a schedule; it next fires at its first slot after now."""
        return self._database.run(schedules.enable_schedule(self.op_context, name))

    def disable_schedule(self, name: str) -> Schedule:
        """Disable a schedule: it does not fire (nor catch up) until enabled."""
        return self._database.run(schedules.disable_schedule(name))

    def remove_schedule(self, name: str) -> None:
        """Delete a schedule; the jobs it already enqueued stay."""
        self._database.run(schedules.remove_schedule(name))

    def run_schedule_now(self, name: str) -> Enqueued:
        """Enqueue one job of the schedule now (its fire times do not change)."""
        return self._database.run(schedules.run_schedule_now(self.op_context, name))

    # --- maintenance -----------------------------------------------------------

    def reap(self) -> int:
        """Reclaim jobs whose lease expired (as workers do periodically); returns how many."""
        return self._database.run(maintenance.reap(self.op_context))

    def archive(
        self,
        older_than: Age,
        limit: int | None = None,
        statuses: Sequence[str] = ("succeeded",),
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Move finished jobs older than ``older_than`` (``"7d"``, seconds, a
        timedelta) to the archive table in short batches; returns how many."""
        return self._database.run(
            maintenance.archive(self.op_context, older_than, limit, statuses, batch_size, progress)
        )

    def prune(
        self,
        older_than: Age,
        limit: int | None = None,
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, int]:
        """Delete attempt history and finished jobs older than the cutoff, now
        (workers do it by the stored retention, :meth:`set_retention`);
        returns ``{"attempts": n, "archived_jobs": m}``. Finished jobs go by
        whole time ranges, as retention removes them, then the archive
        table's rows (:meth:`archive`)."""
        return self._database.run(
            maintenance.prune(self.op_context, older_than, limit, batch_size, progress)
        )

    def set_retention(
        self,
        succeeded: Age | None = None,
        cancelled: Age | None = None,
        dead: Age | None = None,
    ) -> Retention:
        """How long finished jobs are kept before they are deleted with their
        attempts (durations like ``"1d"``, seconds or timedeltas; None keeps
        the current value; ``"0s"``: deleted when they end). Stored in the
        database; the workers apply it (to jobs already finished too) at their
        next maintenance pass. Defaults: succeeded 1 day, cancelled 7 days,
        dead 30 days::

            app.set_retention(succeeded="6h", dead="90d")
        """
        return self._database.run(retention.set_(succeeded, cancelled, dead))

    def get_retention(self) -> Retention:
        """How long finished jobs are kept, by status (see :meth:`set_retention`)."""
        return self._database.run(retention.get())

    def archive_count(self, older_than: Age, statuses: Sequence[str] = ("succeeded",)) -> int:
        """How many jobs :meth:`archive` with these arguments would move now."""
        return self._database.run(maintenance.archive_count(self.op_context, older_than, statuses))

    def prune_count(self, older_than: Age) -> int:
        """How many rows (attempts plus archived jobs) :meth:`prune` would delete now."""
        return self._database.run(maintenance.prune_count(self.op_context, older_than))

    def vacuum(self) -> list[TableVacuum]:
        """VACUUM (ANALYZE) the queue tables; returns each table's dead tuples
        before and after. Runs on a dedicated autocommit connection, since
        VACUUM refuses a transaction block and may hold a connection for long."""
        with self._database.connect() as conn:
            return self._database.run(maintenance.vacuum(self.schema), conn)

    def partition_archive(self, period: str = "day") -> ArchiveLayout:
        """Range-partition the archive by finish time, one partition per
        ``period`` (``"day"``, ``"week"`` or ``"month"``), online: reads and
        archive runs go on. ``prune`` then drops whole partitions instead of
        deleting rows. A no-op when already partitioned by that period. Runs
        as the schema's owner (or ``pgqueue grant --admin``), on a dedicated
        autocommit connection (one step builds an index CONCURRENTLY)."""
        with self._database.connect() as conn:
            layout, _ = self._database.run(partitions.partition_archive(period), conn)
        return layout

    def archive_layout(self) -> ArchiveLayout:
        """Whether the archive is partitioned, by which period, in how many partitions."""
        return self._database.run(partitions.layout())

    def check(
        self, max_ready_age: Age = 300, worker_timeout: Age = 60, max_clock_skew: Age = 5
    ) -> HealthReport:
        """Check connectivity, clock skew, schema revision, stuck jobs (running
        with an expired lease), dead workers (no heartbeat for ``worker_timeout``)
        and queues whose oldest ready job waited over ``max_ready_age``.
        ``report.ok`` is the verdict; an unreachable database or unmigrated
        schema is a failed check in the report, not an exception."""
        check = health_ops.check(
            self.op_context, HealthSettings.build(max_ready_age, worker_timeout, max_clock_skew)
        )
        try:
            with self._database.connect() as conn:
                return self._database.run(check, conn)
        except ConnectionFailed as exc:
            return health_report.unreachable(exc)

    # --- task registry, settings, limits, statistics, workers -----------------

    def set_task_options(
        self,
        task: str,
        *,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        lease_seconds: float | None = None,
        priority: int | None = None,
        retry: Backoff | None = None,
        unset: Sequence[str] = (),
    ) -> None:
        """Override a task's settings in the database, for every worker from
        its next lease (no restart): ``max_attempts`` (0: unlimited),
        ``timeout``, ``lease_seconds``, ``priority`` (for jobs enqueued
        without one) and ``retry``. None leaves a field as it is; name fields
        in ``unset`` to go back to the code's defaults."""
        self._database.run(task_ops.set_options(task, task_options(locals()), unset))

    def set_task_limit(
        self, task: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Limit how many jobs of ``task`` run at once across all workers and
        how many start per period (``rate="100/1m"``); None lifts a limit.
        Other tasks of the same queue are not held back."""
        self._database.run(task_ops.set_limit(task, concurrency, rate))

    def get_task(self, name: str) -> TaskInfo:
        """A task as the database knows it (published defaults, settings,
        live workers); raises TaskNotFound."""
        return self._database.run(task_ops.get_task(name))

    def list_tasks(self) -> list[TaskInfo]:
        """Every task published by a worker or with settings."""
        return self._database.run(task_ops.list_tasks())

    def task_stats(
        self,
        task: str | None = None,
        since: datetime | timedelta | str | float | None = None,
        *,
        sample: int | None = None,
    ) -> dict[str, TaskStats]:
        """Run statistics per task for jobs and attempts finished since
        ``since`` (a datetime, or an age such as ``"1h"``; default 24 h).
        ``sample``: when more jobs than that finished in the window, start it
        at the finish of the ``sample``-th newest instead (bounded cost on a
        busy system; each TaskStats' ``window_start`` says where it began)."""
        return self._database.run(task_ops.task_stats(task, since, sample=sample))

    def unknown_tasks(self) -> list[UnknownTaskJobs]:
        """Tasks of waiting jobs that no live worker knows (status, doctor)."""
        return self._database.run(task_ops.unknown_tasks())

    def list_workers(self) -> list[WorkerInfo]:
        """Registered workers with their state: alive, stale or lost."""
        return self._database.run(task_ops.list_workers())

    def forget_worker(self, worker_id: str, force: bool = False) -> bool:
        """Remove a worker's registration (refused, False, while it is alive
        unless ``force``); its jobs are left to the reaper."""
        return self._database.run(task_ops.forget_worker(worker_id, force))

    # --- telemetry: database view, doctor -------------------------------------------

    def queue_view(self, cap: int = database_view.DEFAULT_CAP) -> QueueView:
        """Jobs per queue and status (exact up to ``cap``, estimated beyond),
        oldest ready age, paused, live workers: the data of ``pgqueue metrics``."""
        return self._database.run(database_view.collect(self.op_context, cap))

    def metrics_text(self, cap: int = database_view.DEFAULT_CAP) -> str:
        """:meth:`queue_view` as Prometheus text: ``pgqueue_queue_jobs{queue,status}``,
        ``pgqueue_queue_oldest_ready_age_seconds{queue}``, ``pgqueue_queue_paused{queue}``,
        ``pgqueue_workers_alive`` (serve it at ``/metrics``)."""
        view = self.queue_view(cap)
        return view.prometheus_text()

    def doctor(self, **thresholds: Any) -> list[Finding]:
        """Diagnose the database (see :mod:`pgqueue.telemetry.doctor`): one
        :class:`Finding` per check with severity, evidence and fix. Thresholds
        (durations like ``"5m"`` or seconds): ``max_transaction_age``,
        ``error_transaction_age``, ``worker_timeout``, ``max_ready_age``,
        ``max_clock_skew``, ``archive_after``; counts: ``dead_tuples_min``,
        ``archive_backlog``; ``notify_queue_warn`` (0-1). Never raises for
        what it finds (an unreachable database is an error finding)."""
        settings = self._doctor_settings(thresholds)
        database = self._database
        try:
            # Two dedicated connections: whether one server process serves
            # both tells a transaction pooler in the path.
            with (
                database.connect() as first,
                database.connect() as second,
            ):
                try:
                    probe: doctor.PoolerProbe | None = doctor.pooler_probe(
                        database.dsn,
                        first,
                        database.run(doctor.backend(), first),
                        database.run(doctor.backend(), second),
                    )
                except DatabaseError:
                    probe = None
                return database.run(doctor.diagnose(self.op_context, settings, probe), first)
        except ConnectionFailed as exc:
            return doctor.unreachable(exc)
