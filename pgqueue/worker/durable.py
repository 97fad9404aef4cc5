"""Durable tasks in a running job: ``context.step``, ``context.sleep`` and
``context.wait_for_event``.

A task runs again from its top each time its job runs again; what an
earlier run stored (in ``job_steps``) is read once per run, on the first
durable call, and never for a job that makes none. A step's result is
stored before the step returns, fenced by the attempt id like a completion
(a reaped attempt gets :class:`pgqueue.LeaseLost`). A first sleep stores
itself and ends the attempt (outcome ``slept``: the job is queued again at
the wake-up time, no attempt spent); a wait for an event that was not sent
sets the job ``waiting`` in the database and ends the run without a
completion (:class:`Parked`). The statements run on the task connections of
``context.transaction()`` (:class:`TaskConnections`), not the worker's pool.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pgqueue.errors import EventTimeout, InvalidInput, PgQueueError
from pgqueue.ops import Op
from pgqueue.ops import durable as ops
from pgqueue.payloads import loads_stored

if TYPE_CHECKING:
    from pgqueue.database import Database
    from pgqueue.models import StepRecord
    from pgqueue.worker.task_transaction import TaskConnections

T = TypeVar("T")

#: Tries of one durable statement on transient database errors (it is
#: idempotent: a stored step is never stored twice, a fenced write of a lost
#: lease changes nothing).
TRIES = 4
BACKOFF = 0.2


class Suspend(BaseException):
    """The run of a durable task ends here (a BaseException, so that a task's
    ``except Exception`` does not swallow it)."""


class SleepUntil(Suspend):
    """``context.sleep``: the attempt ends ``slept``; the job runs again at ``wake_at``."""

    def __init__(self, wake_at: datetime) -> None:
        super().__init__(f"sleeping until {wake_at.isoformat()}")
        self.wake_at = wake_at


class Parked(Suspend):
    """``context.wait_for_event``: the job is already ``waiting`` in the
    database; the run ends without a completion."""

    def __init__(self, key: str) -> None:
        super().__init__(f"waiting for event {key!r}")
        self.key = key


class CancelRequested(Exception):
    """A cancel was requested while the job was about to wait: the attempt
    fails and, the cancel being requested, the job ends cancelled."""


class DurableSource:
    """What a worker's jobs use for their durable calls: the database driver,
    the task connections and the size limit of a stored value."""

    def __init__(
        self,
        database: Database,
        connections: TaskConnections,
        max_value_bytes: int,
        clock: Callable[[], datetime | None] | None = None,
    ) -> None:
        self.database = database
        self.connections = connections
        self.max_value_bytes = max_value_bytes
        self.clock = clock  # the ops' clock (a drain's jumps); None or None returned: now

    def now(self) -> datetime:
        """When a sleep counts as over: the ops' clock when it has one, else now."""
        at = self.clock() if self.clock is not None else None
        return at if at is not None else datetime.now(UTC)

    def for_job(self, job_id: int, attempt_id: int) -> DurableRun:
        return DurableRun(self, job_id, attempt_id)

    def run_sync(self, make_op: Callable[[], Op[T]]) -> T:
        for attempt in range(TRIES):
            try:
                with self.connections.sync_pool().connection() as conn:
                    return self.database.run(make_op(), conn)
            except PgQueueError as exc:
                if not getattr(exc, "transient", False) or attempt == TRIES - 1:
                    raise
            time.sleep(BACKOFF * (attempt + 1))
        raise AssertionError("unreachable")

    async def run_async(self, make_op: Callable[[], Op[T]]) -> T:
        for attempt in range(TRIES):
            try:
                pool = await self.connections.async_pool()
                async with pool.connection() as conn:
                    return await self.database.run_async(make_op(), conn)
            except PgQueueError as exc:
                if not getattr(exc, "transient", False) or attempt == TRIES - 1:
                    raise
            await asyncio.sleep(BACKOFF * (attempt + 1))
        raise AssertionError("unreachable")


def _utcnow() -> datetime:
    return datetime.now(UTC)


class DurableRun:
    """The durable calls of one run (one attempt) of one job."""

    def __init__(self, source: DurableSource, job_id: int, attempt_id: int) -> None:
        self.source = source
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.stored: dict[str, StepRecord] | None = None
        self.used: set[str] = set()
        self.sleeps = 0
        self.suspended: Suspend | None = None

    # --- shared -----------------------------------------------------------------

    def _claim(self, name: str) -> None:
        if self.suspended is not None:
            raise self.suspended  # the run already ended (a task that caught it)
        if name in self.used:
            raise InvalidInput(
                f"step name {name!r} is used twice in one run of job {self.job_id}: "
                "each step, sleep and event wait of a task needs its own name"
            )
        self.used.add(name)

    def _load(self) -> Op[list[StepRecord]]:
        return ops.list_steps(self.job_id)

    def _loaded(self, records: list[StepRecord]) -> dict[str, StepRecord]:
        self.stored = {r.name: r for r in records}
        return self.stored

    def _suspend(self, exc: Suspend) -> Suspend:
        self.suspended = exc
        return exc

    def _sleep_name(self, name: str | None) -> str:
        self.sleeps += 1
        return f"sleep#{self.sleeps}" if name is None else ops.step_name("a sleep's name", name)

    # --- sync (tasks in threads) --------------------------------------------------

    def records_sync(self) -> dict[str, StepRecord]:
        return (
            self.stored
            if self.stored is not None
            else self._loaded(self.source.run_sync(self._load))
        )

    def step_sync(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        ops.step_name("a step's name", name)
        self._claim(name)
        found = self.records_sync().get(name)
        if found is not None and found.kind == "step":
            return found.result
        self._kind_clash(found, "step")
        started = _utcnow()
        value = fn(*args, **kwargs)
        text = ops.encode_value(f"the result of step {name!r}", value, self.source.max_value_bytes)
        self.source.run_sync(lambda: self._store(name, "step", "succeeded", text, started))
        return loads_stored(text)

    def sleep_sync(self, wake_at: datetime, name: str | None) -> None:
        key = self._sleep_name(name)
        self._claim(key)
        self._sleep_decide(key, self.records_sync().get(key), wake_at, self.source.run_sync)

    def wait_sync(self, key: str, timeout: float | None, name: str | None) -> Any:
        step = self._wait_name(key, name)
        found = self.records_sync().get(step)
        if (settled := self._wait_settled(step, key, found)) is not _PENDING:
            return settled
        outcome, payload = self.source.run_sync(lambda: self._wait(step, key, timeout))
        return self._wait_outcome(key, outcome, payload)

    # --- async (tasks on the event loop) ------------------------------------------

    async def records_async(self) -> dict[str, StepRecord]:
        if self.stored is not None:
            return self.stored
        return self._loaded(await self.source.run_async(self._load))

    async def step_async(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        ops.step_name("a step's name", name)
        self._claim(name)
        found = (await self.records_async()).get(name)
        if found is not None and found.kind == "step":
            return found.result
        self._kind_clash(found, "step")
        started = _utcnow()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        text = ops.encode_value(f"the result of step {name!r}", value, self.source.max_value_bytes)
        await self.source.run_async(lambda: self._store(name, "step", "succeeded", text, started))
        return loads_stored(text)

    async def sleep_async(self, wake_at: datetime, name: str | None) -> None:
        key = self._sleep_name(name)
        self._claim(key)
        found = (await self.records_async()).get(key)
        if found is None:
            await self.source.run_async(
                lambda: self._store(key, "sleep", "sleeping", None, _utcnow(), wake_at)
            )
        self._sleep_decide(key, found, wake_at, None)

    async def wait_async(self, key: str, timeout: float | None, name: str | None) -> Any:
        step = self._wait_name(key, name)
        found = (await self.records_async()).get(step)
        if (settled := self._wait_settled(step, key, found)) is not _PENDING:
            return settled
        outcome, payload = await self.source.run_async(lambda: self._wait(step, key, timeout))
        return self._wait_outcome(key, outcome, payload)

    # --- the decisions, shared by both --------------------------------------------

    def _kind_clash(self, found: StepRecord | None, kind: str) -> None:
        if found is not None and found.kind != kind:
            raise InvalidInput(
                f"name {found.name!r} of job {self.job_id} is stored as a {found.kind}, "
                f"not a {kind}: give each step, sleep and event wait its own name"
            )

    def _store(
        self,
        name: str,
        kind: str,
        status: str,
        text: str | None,
        started: datetime,
        wake_at: datetime | None = None,
    ) -> Op[None]:
        return ops.store_step(
            self.job_id,
            self.attempt_id,
            name,
            kind=kind,
            status=status,
            result=text,
            started_at=started,
            wake_at=wake_at,
        )

    def _sleep_decide(
        self,
        key: str,
        found: StepRecord | None,
        wake_at: datetime,
        run: Callable[[Callable[[], Op[None]]], None] | None,
    ) -> None:
        """Sleep (end the run) unless this sleep is stored and its time passed.
        ``run``: store the first sleep with it (the async form stored it already)."""
        self._kind_clash(found, "sleep")
        if found is not None:
            wake_at = found.wake_at or wake_at
            if wake_at <= self.source.now():
                return
        elif run is not None:
            run(lambda: self._store(key, "sleep", "sleeping", None, _utcnow(), wake_at))
        raise self._suspend(SleepUntil(wake_at))

    def _wait_name(self, key: str, name: str | None) -> str:
        ops.step_name("an event key", key)
        step = f"event:{key}" if name is None else ops.step_name("an event wait's name", name)
        self._claim(step)
        return step

    def _wait_settled(self, step: str, key: str, found: StepRecord | None) -> Any:
        self._kind_clash(found, "event")
        if found is None or found.status == "waiting":
            return _PENDING
        if found.status == "timed_out":
            raise EventTimeout(key)
        return found.result

    def _wait(self, step: str, key: str, timeout: float | None) -> Op[tuple[str, Any]]:
        return ops.wait_event(self.job_id, self.attempt_id, step, key, timeout, _utcnow())

    def _wait_outcome(self, key: str, outcome: str, payload: Any) -> Any:
        if outcome == "received":
            return payload
        if outcome == "timed_out":
            raise EventTimeout(key)
        if outcome == "cancelled":
            raise CancelRequested(f"cancel requested while waiting for event {key!r}")
        raise self._suspend(Parked(key))


_PENDING: Any = object()
