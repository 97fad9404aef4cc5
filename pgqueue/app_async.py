"""App's operations, async: the one source of the sync ones.

Each method is one line over the same operation in :mod:`pgqueue.ops`, run
by the App's :class:`~pgqueue.database.Database`. ``tools/async_to_sync.py``
writes the sync class from this one (each name loses its async suffix, and
``await`` goes): edit here, then run it. :class:`pgqueue.App` inherits both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Unpack

import psycopg

from pgqueue import health_report
from pgqueue._adapters import ConnectionLike, async_connection
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


class AsyncAppOperations(AppBase):
    """The operations of :class:`pgqueue.App`, one method each."""

    # --- enqueue -------------------------------------------------------------

    async def enqueue_async(
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
        return await self.enqueue_spec_async(JobSpec(task, payload, **options), conn=conn)

    async def enqueue_spec_async(
        self, spec: JobSpec, *, conn: ConnectionLike | None = None
    ) -> Enqueued:
        """Enqueue one :class:`JobSpec` (what :meth:`enqueue` and ``task.enqueue`` call)."""
        return await self._database.run_async(
            enqueue.enqueue_one(self.op_context, spec), await async_connection(conn)
        )

    async def enqueue_many_async(
        self, specs: Sequence[JobSpec], *, conn: ConnectionLike | None = None
    ) -> list[Enqueued]:
        """Enqueue many jobs in one statement and one transaction (all or
        nothing); dedup hits return the live job's id, in input order."""
        return await self._database.run_async(
            enqueue.enqueue_many(self.op_context, specs), await async_connection(conn)
        )

    @asynccontextmanager
    async def transaction_async(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection in a transaction, to pass as ``conn=`` to calls
        that must commit together (``pgqueue enqueue --file`` uses it): it
        commits when the block ends, and rolls back on an exception."""
        pool = await self._database.pool_async()
        async with pool.connection() as conn, conn.transaction():
            yield conn

    # --- workflows -------------------------------------------------------------

    async def send_event_async(
        self, key: str, payload: Any = None, *, conn: ConnectionLike | None = None
    ) -> int:
        """Send the event ``key`` with a JSON ``payload``: stored (kept as long
        as cancelled jobs) and every job waiting for it in
        ``context.wait_for_event(key)`` is released, in ``conn``'s transaction
        when given (nothing happens if it rolls back). A job that waits for
        ``key`` later gets it at once; sending a key again replaces its
        payload. Returns how many waiting jobs it released."""
        return await self._database.run_async(
            durable.send_event(key, payload, self.max_payload_bytes),
            await async_connection(conn),
        )

    async def enqueue_workflow_async(
        self, workflow: Workflow, *, conn: ConnectionLike | None = None
    ) -> WorkflowRun:
        """Write ``workflow``'s steps (what :meth:`Workflow.enqueue` calls)."""
        return await self._database.run_async(
            workflows.enqueue_workflow(self.op_context, workflow), await async_connection(conn)
        )

    async def get_workflow_async(self, workflow_id: int) -> WorkflowInfo:
        """A workflow with each step's job and what it waits for."""
        return await self._database.run_async(workflows.get_workflow(workflow_id))

    async def cancel_workflow_async(self, workflow_id: int) -> int:
        """Cancel the workflow's live steps (running ones are asked to stop);
        returns how many were cancelled or asked to stop."""
        return await self._database.run_async(workflows.cancel_workflow(workflow_id))

    async def list_workflows_async(
        self, status: str | None = None, limit: int = 50, *, name: str | None = None
    ) -> list[WorkflowInfo]:
        """Workflows, newest first (``status``: running, succeeded or failed;
        ``name``: only the workflows of that name)."""
        return await self._database.run_async(workflows.list_workflows(status, limit, name))

    # --- low-level consumer API ----------------------------------------------

    async def lease_async(
        self,
        queue: str | Sequence[str] | None,
        worker_id: str,
        max: int = 1,
        lease_seconds: float | None = None,
    ) -> list[LeasedJob]:
        """Lease up to ``max`` ready jobs of ``queue`` (a name, names, or None
        for every queue), highest priority first, then by run_at and id;
        ``lease_seconds`` overrides the jobs' own."""
        return await self._database.run_async(
            consume.lease(self.op_context, queue, worker_id, max, lease_seconds)
        )

    async def ack_async(self, leased: LeasedJob, result: Any = None) -> None:
        """Mark a leased job succeeded, storing ``result`` (JSON, with the
        encoding of :func:`pgqueue.payloads.encode_result`). Raises LeaseLost,
        changing nothing, when this lease is no longer valid, and
        InvalidPayload, changing nothing, for a result that cannot be stored."""
        value = storable_result(result, self.max_result_bytes)
        await self._database.run_async(consume.ack_many(self.op_context, [leased], [value]))

    async def ack_many_async(self, leased: Sequence[LeasedJob]) -> None:
        """Ack many jobs in one statement; LeaseLost names any that were stale
        (the others are acked)."""
        await self._database.run_async(consume.ack_many(self.op_context, leased))

    async def fail_async(
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
            await self._database.run_async(
                consume.fail(self.op_context, leased, error, retry_at, permanent)
            )
        )

    async def nack_async(self, leased: LeasedJob) -> None:
        """Hand a leased job back to its queue now, unrun (the attempt is
        recorded as ``released`` and does not count)."""
        await self._database.run_async(consume.nack_many(self.op_context, [leased]))

    async def extend_async(self, leased: LeasedJob, seconds: float) -> bool:
        """Extend the lease to now + ``seconds``; False when the lease is lost."""
        return await self._database.run_async(consume.extend(self.op_context, leased, seconds))

    # --- inspection ------------------------------------------------------------

    async def get_job_async(self, job_id: int, history: bool = False) -> Job:
        """A job by id (live or archived); ``history=True`` loads every attempt."""
        return await self._database.run_async(inspect.get_job(job_id, history))

    async def list_jobs_async(
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
        return await self._database.run_async(
            inspect.list_jobs(queue, status, task, limit, cursor, tags, group_key)
        )

    async def metrics_async(self, queue: str | None = None) -> dict[str, QueueMetrics]:
        """Counts per queue: queued, scheduled, running, succeeded (last hour),
        dead, cancelled, oldest ready age, paused."""
        return await self._database.run_async(inspect.metrics(queue))

    async def explain_async(self, job_id: int) -> str:
        """Why a job is where it is, in plain words."""
        return await self._database.run_async(inspect.explain(job_id))

    async def result_async(self, job_id: int, timeout: float | None = None) -> Any:
        """The job's stored return value, waiting (via NOTIFY, or polling when
        the App has ``listen=False``) until it finishes; no pooled connection
        is held while waiting. Raises JobFailed (dead), JobCancelled,
        ResultTimeout, or ResultNotStored (it succeeded, but its return value
        could not be stored)."""
        return await self._database.run_released_async(self._result_op(job_id, timeout))

    # --- the dashboard's reads (bounded; see pgqueue.ops.dashboard) ---------------

    async def job_page_async(
        self, flt: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> JobPage:
        """A page of the jobs ``flt`` matches as the dashboard lists them: the
        statements of :meth:`list_jobs`, finished statuses in the order of
        their finish, free text searched over a bounded window of ids."""
        return await self._database.run_async(inspect.job_page(flt, cursor, limit))

    async def queue_rows_async(self, finished: bool = True) -> list[QueueRow]:
        """Every queue's counts as :meth:`metrics` counts them, saying which
        are capped or estimated; ``finished=False``: the live counts only."""
        return await self._database.run_async(dashboard.queue_rows(finished))

    async def throughput_async(
        self,
        per_minute: int = dashboard.THROUGHPUT_PER_MINUTE,
        hour_cap: int = dashboard.THROUGHPUT_HOUR_CAP,
    ) -> Throughput:
        """Jobs finished in each of the last 60 minutes and in the hour, exact
        up to ``per_minute`` a minute and ``hour_cap`` an hour, estimated past."""
        return await self._database.run_async(dashboard.throughput(per_minute, hour_cap))

    async def dead_groups_async(
        self, sample: int = dashboard.DEAD_GROUP_SAMPLE
    ) -> tuple[list[DeadGroup], bool]:
        """The newest ``sample`` dead jobs grouped by task, error code and
        message fingerprint; True when the sample was full."""
        return await self._database.run_async(dashboard.dead_groups(sample))

    async def dead_group_batch_async(
        self, group: tuple[str, str, str], cursor: tuple[datetime, int] | None, scan: int
    ) -> tuple[list[int], tuple[datetime, int] | None]:
        """The ids of one dead-letter group among the next ``scan`` dead jobs
        of its task, and the cursor after them (None: no more)."""
        return await self._database.run_async(dashboard.dead_group_batch(group, cursor, scan))

    async def change_mark_async(self) -> tuple[Any, ...]:
        """A tuple that changes whenever jobs, queues or workers change."""
        return await self._database.run_async(dashboard.change_mark())

    # --- administration ----------------------------------------------------------

    async def cancel_async(self, job_id: int) -> JobStatus:
        """Cancel a job: queued or scheduled ones end ``cancelled`` now (returns
        cancelled); a running one is asked to stop and ends cancelled when its
        attempt ends (returns running). Cancelling a finished job is an error."""
        return await self._database.run_async(operator.cancel(job_id))

    async def cancel_many_async(
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
        return [r[0] for r in await self._database.run_async(operator.cancel_batch(params))]

    async def count_cancellable_async(
        self,
        *,
        queue: str | None = None,
        task: str | None = None,
        statuses: Sequence[str] = ("queued", "scheduled"),
    ) -> int:
        """How many live jobs :meth:`cancel_many` with these filters would
        cancel (or ask to stop) now, counted in one statement."""
        params = operator.cancel_params(None, queue, task, statuses)
        return await self._database.run_async(operator.count_cancellable(params))

    async def job_statuses_async(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The status of each of these jobs that exists (live or archived),
        by id, in one statement; ids of no job are left out."""
        return await self._database.run_async(operator.job_statuses(job_ids))

    async def list_queues_async(self) -> list[str]:
        """The name of every queue the database knows, sorted."""
        return await self._database.run_async(operator.queue_names())

    async def schema_summary_async(self) -> dict[str, int]:
        """What :meth:`uninstall` would drop: ``jobs``, ``archived_jobs``,
        ``live_jobs`` (queued or running) and ``live_workers``."""
        return await self._database.run_async(operator.schema_summary())

    async def uninstall_async(self) -> None:
        """Drop this App's schema with every job, schedule and setting in it
        (what ``pgqueue uninstall`` does after its checks); cannot be undone."""
        await self._database.run_async(operator.drop_schema())
        await self._database.close_async()

    async def delete_queue_async(self, queue: str) -> None:
        """Delete a queue and its settings (pause, limits); refused with
        InvalidJobState while it holds live or dead jobs."""
        await self._database.run_async(operator.delete_queue(queue))

    async def replay_async(
        self, job_id: int, queue: str | None = None, run_at: datetime | None = None
    ) -> Replayed:
        """Enqueue a copy of any job (e.g. a succeeded or dead one); returns
        the new id as a :class:`Replayed` (an int with ``job_id`` and
        ``replayed_from``, the fields of ``pgqueue jobs replay --json``).
        An admin action: a producer or worker role gets PermissionDenied."""
        op = admin.replay(job_id, queue, run_at, schema=self.schema)
        return Replayed(await self._database.run_async(op), job_id)

    async def requeue_dead_async(self, job_id: int) -> None:
        """Put a dead job back in its queue (with one more attempt if needed)."""
        await self._database.run_async(admin.requeue_dead(job_id))

    async def requeue_dead_many_async(
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
        return await self._database.run_async(admin.requeue_dead_batch(job_ids, queue, task, limit))

    async def count_dead_async(self, queue: str | None = None, task: str | None = None) -> int:
        """How many dead jobs match the filters."""
        return await self._database.run_async(admin.count_dead(queue, task))

    async def pause_queue_async(self, queue: str) -> None:
        """Stop every worker from leasing jobs of ``queue`` (enqueue still works)."""
        await self._database.run_async(admin.set_paused(queue, True))

    async def resume_queue_async(self, queue: str) -> None:
        """Let workers lease jobs of ``queue`` again."""
        await self._database.run_async(admin.set_paused(queue, False))

    async def set_queue_limit_async(
        self, queue: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Limit ``queue`` across all workers: at most ``concurrency`` jobs
        running, at most ``rate`` (e.g. ``"100/1m"``) lease starts per sliding
        window. None lifts that limit."""
        await self._database.run_async(admin.set_limits(queue, concurrency, rate))

    # --- schedules ---------------------------------------------------------------

    async def add_schedule_async(
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
        return await self._database.run_async(
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

    async def list_schedules_async(self) -> list[Schedule]:
        """Every schedule, by name."""
        return await self._database.run_async(schedules.list_schedules())

    async def get_schedule_async(self, name: str) -> Schedule:
        """One schedule by name; raises ScheduleNotFound."""
        return await self._database.run_async(schedules.get_schedule(name))

    async def enable_schedule_async(self, name: str) -> Schedule:
        """Enable a schedule; it next fires at its first slot after now."""
        return await self._database.run_async(schedules.enable_schedule(self.op_context, name))

    async def disable_schedule_async(self, name: str) -> Schedule:
        """Disable a schedule: it does not fire (nor catch up) until enabled."""
        return await self._database.run_async(schedules.disable_schedule(name))

    async def remove_schedule_async(self, name: str) -> None:
        """Delete a schedule; the jobs it already enqueued stay."""
        await self._database.run_async(schedules.remove_schedule(name))

    async def run_schedule_now_async(self, name: str) -> Enqueued:
        """Enqueue one job of the schedule now (its fire times do not change)."""
        return await self._database.run_async(schedules.run_schedule_now(self.op_context, name))

    # --- maintenance -----------------------------------------------------------

    async def reap_async(self) -> int:
        """Reclaim jobs whose lease expired (as workers do periodically); returns how many."""
        return await self._database.run_async(maintenance.reap(self.op_context))

    async def archive_async(
        self,
        older_than: Age,
        limit: int | None = None,
        statuses: Sequence[str] = ("succeeded",),
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Move finished jobs older than ``older_than`` (``"7d"``, seconds, a
        timedelta) to the archive table in short batches; returns how many."""
        return await self._database.run_async(
            maintenance.archive(self.op_context, older_than, limit, statuses, batch_size, progress)
        )

    async def prune_async(
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
        return await self._database.run_async(
            maintenance.prune(self.op_context, older_than, limit, batch_size, progress)
        )

    async def set_retention_async(
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
        return await self._database.run_async(retention.set_(succeeded, cancelled, dead))

    async def get_retention_async(self) -> Retention:
        """How long finished jobs are kept, by status (see :meth:`set_retention`)."""
        return await self._database.run_async(retention.get())

    async def archive_count_async(
        self, older_than: Age, statuses: Sequence[str] = ("succeeded",)
    ) -> int:
        """How many jobs :meth:`archive` with these arguments would move now."""
        return await self._database.run_async(
            maintenance.archive_count(self.op_context, older_than, statuses)
        )

    async def prune_count_async(self, older_than: Age) -> int:
        """How many rows (attempts plus archived jobs) :meth:`prune` would delete now."""
        return await self._database.run_async(maintenance.prune_count(self.op_context, older_than))

    async def vacuum_async(self) -> list[TableVacuum]:
        """VACUUM (ANALYZE) the queue tables; returns each table's dead tuples
        before and after. Runs on a dedicated autocommit connection, since
        VACUUM refuses a transaction block and may hold a connection for long."""
        async with await self._database.connect_async() as conn:
            return await self._database.run_async(maintenance.vacuum(self.schema), conn)

    async def partition_archive_async(self, period: str = "day") -> ArchiveLayout:
        """Range-partition the archive by finish time, one partition per
        ``period`` (``"day"``, ``"week"`` or ``"month"``), online: reads and
        archive runs go on. ``prune`` then drops whole partitions instead of
        deleting rows. A no-op when already partitioned by that period. Runs
        as the schema's owner (or ``pgqueue grant --admin``), on a dedicated
        autocommit connection (one step builds an index CONCURRENTLY)."""
        async with await self._database.connect_async() as conn:
            layout, _ = await self._database.run_async(partitions.partition_archive(period), conn)
        return layout

    async def archive_layout_async(self) -> ArchiveLayout:
        """Whether the archive is partitioned, by which period, in how many partitions."""
        return await self._database.run_async(partitions.layout())

    async def check_async(
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
            async with await self._database.connect_async() as conn:
                return await self._database.run_async(check, conn)
        except ConnectionFailed as exc:
            return health_report.unreachable(exc)

    # --- task registry, settings, limits, statistics, workers -----------------

    async def set_task_options_async(
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
        await self._database.run_async(task_ops.set_options(task, task_options(locals()), unset))

    async def set_task_limit_async(
        self, task: str, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Limit how many jobs of ``task`` run at once across all workers and
        how many start per period (``rate="100/1m"``); None lifts a limit.
        Other tasks of the same queue are not held back."""
        await self._database.run_async(task_ops.set_limit(task, concurrency, rate))

    async def get_task_async(self, name: str) -> TaskInfo:
        """A task as the database knows it (published defaults, settings,
        live workers); raises TaskNotFound."""
        return await self._database.run_async(task_ops.get_task(name))

    async def list_tasks_async(self) -> list[TaskInfo]:
        """Every task published by a worker or with settings."""
        return await self._database.run_async(task_ops.list_tasks())

    async def task_stats_async(
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
        return await self._database.run_async(task_ops.task_stats(task, since, sample=sample))

    async def unknown_tasks_async(self) -> list[UnknownTaskJobs]:
        """Tasks of waiting jobs that no live worker knows (status, doctor)."""
        return await self._database.run_async(task_ops.unknown_tasks())

    async def list_workers_async(self) -> list[WorkerInfo]:
        """Registered workers with their state: alive, stale or lost."""
        return await self._database.run_async(task_ops.list_workers())

    async def forget_worker_async(self, worker_id: str, force: bool = False) -> bool:
        """Remove a worker's registration (refused, False, while it is alive
        unless ``force``); its jobs are left to the reaper."""
        return await self._database.run_async(task_ops.forget_worker(worker_id, force))

    # --- telemetry: database view, doctor -------------------------------------------

    async def queue_view_async(self, cap: int = database_view.DEFAULT_CAP) -> QueueView:
        """Jobs per queue and status (exact up to ``cap``, estimated beyond),
        oldest ready age, paused, live workers: the data of ``pgqueue metrics``."""
        return await self._database.run_async(database_view.collect(self.op_context, cap))

    async def metrics_text_async(self, cap: int = database_view.DEFAULT_CAP) -> str:
        """:meth:`queue_view` as Prometheus text: ``pgqueue_queue_jobs{queue,status}``,
        ``pgqueue_queue_oldest_ready_age_seconds{queue}``, ``pgqueue_queue_paused{queue}``,
        ``pgqueue_workers_alive`` (serve it at ``/metrics``)."""
        view = await self.queue_view_async(cap)
        return view.prometheus_text()

    async def doctor_async(self, **thresholds: Any) -> list[Finding]:
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
            async with (
                await database.connect_async() as first,
                await database.connect_async() as second,
            ):
                try:
                    probe: doctor.PoolerProbe | None = doctor.pooler_probe(
                        database.dsn,
                        first,
                        await database.run_async(doctor.backend(), first),
                        await database.run_async(doctor.backend(), second),
                    )
                except DatabaseError:
                    probe = None
                return await database.run_async(
                    doctor.diagnose(self.op_context, settings, probe), first
                )
        except ConnectionFailed as exc:
            return doctor.unreachable(exc)
