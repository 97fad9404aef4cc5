"""Model-based test: hypothesis drives the real database through the App with
random sequences of enqueue (dedup and serial keys, delays, batches), lease,
ack, fail, nack, extend, cancel, requeue_dead, replay, reap and clock jumps,
and after every step compares the database with a small Python model of
the queue's documented rules (README: leases, retries, dedup and serial keys).

Time. The App's ``clock`` is frozen for each step at "the database clock
plus 50 s plus the jumps so far", and only moves forward, so every statement
that takes the clock (lease, ack, fail, nack, extend, reap) sees a value the
model knows exactly. Enqueue, replay and requeue_dead place jobs at the
database's own ``now()`` (plus the delay); the model checks that value against
the wall clock and then adopts it, so "due" and the lease order are computed
exactly. Every delay, lease, backoff and jump is a multiple of 100 s and the
margin is half of that, so no comparison depends on how long a step took:
hypothesis needs each example to replay the same way.

One database for the whole run, emptied before each example.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import pgqueue
from pgqueue import Enqueued, JobSpec, JobStatus, LeasedJob
from pgqueue.errors import DuplicateJob, InvalidJobState, LeaseLost

QUEUES = ("qa", "qb")
WAITING, RUNNING = "waiting", "running"  # model statuses; waiting = queued or scheduled
LIVE = (WAITING, RUNNING)
MODEL_STATUSES = (WAITING, RUNNING, "succeeded", "dead", "cancelled")
LIVE_STATUSES = (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.RUNNING)
# The clock runs this far ahead of the database: half the 100 s grid of every
# delay, lease, backoff and jump, so that values placed by the database and
# values placed by the clock never tie, whatever the wall clock did meanwhile.
MARGIN = timedelta(seconds=50)
# finished_at of a job cancelled while waiting: the database's now(), not the clock.
DB_CLOCK = datetime.min.replace(tzinfo=UTC)
DB_CLOCK_TOLERANCE = timedelta(seconds=2)

# PGQUEUE_MODEL_EXAMPLES=1000 for a longer hunt.
SETTINGS = settings(
    max_examples=int(os.environ.get("PGQUEUE_MODEL_EXAMPLES", "50")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@dataclass(frozen=True)
class TaskSpec:
    """A registered task's defaults; the backoff has no jitter, so the model
    knows each retry time exactly."""

    name: str
    max_attempts: int
    lease_seconds: int
    backoff: pgqueue.Backoff

    def retry_delay(self, attempts: int) -> timedelta:
        b = self.backoff
        seconds = 0.0 if b.base <= 0 else min(b.max, b.base * b.factor ** max(attempts - 1, 0))
        return timedelta(seconds=seconds)


TASKS = {
    "fast": TaskSpec("fast", 3, 300, pgqueue.Backoff(base=0.0, factor=1.0, max=0.0, jitter=0.0)),
    "slow": TaskSpec("slow", 2, 1200, pgqueue.Backoff(300.0, 2.0, max=1000.0, jitter=0.0)),
}


def never_run() -> None:
    """The model test runs no worker; the tasks exist for their defaults."""


class SteppingClock:
    """The App's ``clock``: frozen during a step, moved forward by :meth:`tick`."""

    def __init__(self, skew: timedelta) -> None:
        self.skew = skew  # database clock minus this process's clock
        self.offset = timedelta(0)
        self.value: datetime | None = None

    def __call__(self) -> datetime | None:
        return self.value

    def db_now(self) -> datetime:
        """The database clock, as estimated from ours."""
        return datetime.now(UTC) + self.skew

    def tick(self) -> datetime:
        now = self.db_now() + MARGIN + self.offset
        self.value = now if self.value is None else max(self.value, now)
        return self.value

    def reset(self) -> None:
        self.offset = timedelta(0)
        self.value = None


@dataclass
class Harness:
    """What every example shares: the App, an admin connection, the clock."""

    app: pgqueue.App
    conn: psycopg.Connection[Any]
    clock: SteppingClock
    paths: Counter[str] = field(default_factory=Counter)

    def reset(self) -> None:
        # DELETE, not TRUNCATE: on a server that fsyncs, TRUNCATE costs ~0.1 s
        # per example (new files for every table), DELETE of a few rows ~1 ms.
        with self.conn.transaction():
            for table in ("job_attempts", "jobs_archive", "jobs", "queue_lease_log", "queues"):
                self.conn.execute(f"DELETE FROM pgqueue.{table}")
        self.clock.reset()


@dataclass
class ModelJob:
    id: int
    task: str
    queue: str
    priority: int
    payload: dict[str, Any]
    run_at: datetime
    max_attempts: int
    dedup_key: str | None
    serial_key: str | None
    status: str = WAITING
    attempts: int = 0
    attempt_id: int | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    result: Any = None
    finished_at: datetime | None = None  # None while live; DB_CLOCK when set by now()
    # (attempt_id, attempt number, outcome, worker_id, started_at, finished_at),
    # oldest first; every time in it comes from the App's clock.
    history: list[tuple[int, int, str, str, datetime, datetime | None]] = field(
        default_factory=list
    )

    @property
    def spec(self) -> TaskSpec:
        return TASKS[self.task]

    def order(self) -> tuple[int, datetime, int]:
        return (-self.priority, self.run_at, self.id)

    def close_attempt(self, outcome: str, at: datetime) -> None:
        attempt_id, number, _, worker, started_at, _ = self.history[-1]
        self.history[-1] = (attempt_id, number, outcome, worker, started_at, at)


# Strategies of the rules' arguments.
ENQUEUE_OPTIONS = st.fixed_dictionaries(
    {
        "task": st.sampled_from(sorted(TASKS)),
        "queue": st.sampled_from(QUEUES),
        "priority": st.sampled_from((0, 1, 5)),
        # No time, a delay (after the database's now()), or a run_at given
        # (seconds from now, by the database clock as seen from here).
        "when": st.sampled_from(
            (
                None,
                ("delay", 0),
                ("delay", 100),
                ("delay", 600),
                ("delay", 2000),
                ("run_at", -100),
                ("run_at", 300),
            )
        ),
        "max_attempts": st.sampled_from((None, 1, 2, 3)),
        "dedup_key": st.sampled_from((None, None, "d1", "d2")),
        "serial_key": st.sampled_from((None, None, "s1", "s2")),
    }
)
BATCH = st.lists(ENQUEUE_OPTIONS, min_size=1, max_size=3)
RETRY_IN = st.sampled_from((None, None, -100, 0, 300, 2000))  # seconds from the clock
# Producers pause while this many jobs wait, so that the steps go to consumers.
MAX_WAITING = 6
# Which holder a consumer rule presents: one whose lease is current (when there
# is one) or any lease ever handed out (most of those are stale).
PICK_CURRENT = st.sampled_from((True, True, False))
# Which job an admin rule targets: one in that status when there is one, else any.
JOB_PICK = st.sampled_from((None, WAITING, RUNNING, "succeeded", "dead", "dead", "cancelled"))


def delay(options: dict[str, Any]) -> float | None:
    when = options["when"]
    return float(when[1]) if when is not None and when[0] == "delay" else None


def given_run_at(options: dict[str, Any], now: datetime) -> datetime | None:
    when = options["when"]
    return now + timedelta(seconds=when[1]) if when is not None and when[0] == "run_at" else None


class QueueMachine(RuleBasedStateMachine):
    """The state machine; the test binds ``harness`` in a subclass."""

    harness: ClassVar[Harness]

    def __init__(self) -> None:
        super().__init__()
        harness = self.harness
        self.app = harness.app
        self.clock = harness.clock
        harness.reset()
        self.model: dict[int, ModelJob] = {}
        self.queues: set[str] = set()
        self.holders: list[LeasedJob] = []  # every lease handed out, oldest first
        self.last_attempt_id = 0
        self.touched: set[int] = set()  # jobs whose history is checked after this step
        self.payloads = 0

    # --- model helpers -----------------------------------------------------------------

    def note(self, path: str) -> None:
        """Count which paths the run exercised (printed by the test)."""
        event(path)
        self.harness.paths[path] += 1

    def live_duplicate(self, queue: str, dedup_key: str | None) -> ModelJob | None:
        if dedup_key is None:
            return None
        for job in self.model.values():
            if job.queue == queue and job.dedup_key == dedup_key and job.status in LIVE:
                return job
        return None

    def serial_free(self, job: ModelJob) -> bool:
        """Per-key FIFO: no other live job of the key is older, none is running."""
        if job.serial_key is None:
            return True
        return not any(
            o.id != job.id
            and o.serial_key == job.serial_key
            and o.status in LIVE
            and (o.id < job.id or o.status == RUNNING)
            for o in self.model.values()
        )

    def leasable(self, queue: str, now: datetime) -> list[ModelJob]:
        ready = [
            j
            for j in self.model.values()
            if j.queue == queue and j.status == WAITING and j.run_at <= now and self.serial_free(j)
        ]
        return sorted(ready, key=ModelJob.order)

    def holds(self, leased: LeasedJob) -> bool:
        job = self.model[leased.job_id]
        return job.status == RUNNING and job.attempt_id == leased.attempt_id

    def jobs_in(self, status: str | None) -> list[int]:
        return sorted(j.id for j in self.model.values() if status in (None, j.status))

    def pick_holder(self, data: st.DataObject, current: bool) -> LeasedJob:
        fresh = [h for h in self.holders if self.holds(h)]
        holder = data.draw(st.sampled_from(fresh if current and fresh else self.holders))
        self.touched.add(holder.job_id)
        return holder

    def pick_job(self, data: st.DataObject, status: str | None) -> ModelJob:
        job_id = data.draw(st.sampled_from(self.jobs_in(status) or self.jobs_in(None)))
        self.touched.add(job_id)
        return self.model[job_id]

    def placed_by_database(self, job_id: int, before: datetime, delay: float) -> datetime:
        """run_at of a job the database placed at its now() + delay: check it
        against the wall clock, then adopt it."""
        run_at = self.app.get_job(job_id).run_at
        expected = timedelta(seconds=delay)
        low = before + expected - DB_CLOCK_TOLERANCE
        high = self.clock.db_now() + expected + DB_CLOCK_TOLERANCE
        assert low <= run_at <= high, f"job {job_id}: run_at {run_at} not in [{low}, {high}]"
        return run_at

    def add_job(self, job: ModelJob) -> None:
        assert job.id not in self.model, f"job id {job.id} was handed out twice"
        assert all(job.id > known for known in self.model), "job ids must increase"
        self.model[job.id] = job
        self.queues.add(job.queue)
        self.touched.add(job.id)

    def next_payload(self) -> dict[str, Any]:
        self.payloads += 1
        return {"n": self.payloads}

    def check_enqueued(
        self,
        options: dict[str, Any],
        payload: dict[str, Any],
        result: Enqueued,
        before: datetime,
        run_at: datetime | None,
    ) -> None:
        """Apply one enqueue to the model (dedup hit or new job) and check its result."""
        duplicate = self.live_duplicate(options["queue"], options["dedup_key"])
        self.note(f"enqueue {'onto a live duplicate' if duplicate else 'of a new job'}")
        if duplicate is not None:
            assert result == Enqueued(duplicate.id, False)
            return
        assert result.created
        task = TASKS[options["task"]]
        self.add_job(
            ModelJob(
                result.job_id,
                task.name,
                options["queue"],
                options["priority"],
                payload,
                run_at or self.placed_by_database(result.job_id, before, delay(options) or 0.0),
                options["max_attempts"] or task.max_attempts,
                options["dedup_key"],
                options["serial_key"],
            )
        )

    def close(self, job: ModelJob, status: str, outcome: str) -> None:
        """The job's current attempt ends with ``outcome`` now (by the App's
        clock); the job goes to ``status``."""
        now = self.clock.value
        assert now is not None
        job.status = status
        job.lease_expires_at = None
        job.close_attempt(outcome, now)
        job.finished_at = None if status in LIVE else now

    # --- producers ------------------------------------------------------------------------

    # Few, broad rules: hypothesis enables a random subset of the rules in each
    # example (swarm testing), so a chain like enqueue -> lease -> ack only
    # runs where all its rules are on; fewer rules make such chains common.

    @initialize(batch=BATCH)
    def start_with_some_jobs(self, batch: list[dict[str, Any]]) -> None:
        self.enqueue(batch)

    @precondition(lambda self: len(self.jobs_in(WAITING)) < MAX_WAITING)
    @rule(batch=BATCH)
    def enqueue(self, batch: list[dict[str, Any]]) -> None:
        """One job through enqueue, or several through enqueue_many (one
        statement; a dedup key repeated in the batch echoes its first job)."""
        payloads = [self.next_payload() for _ in batch]
        before = self.clock.db_now()
        specs = [
            JobSpec(o["task"], p, o["queue"], o["priority"], given_run_at(o, before), delay(o),
                    o["max_attempts"], o["dedup_key"], o["serial_key"])
            for o, p in zip(batch, payloads, strict=True)
        ]  # fmt: skip
        if len(specs) == 1:
            spec = specs[0]
            results = [self.app.enqueue(spec.task, spec.payload, queue=spec.queue,
                priority=spec.priority, run_at=spec.run_at, delay=spec.delay,
                max_attempts=spec.max_attempts, dedup_key=spec.dedup_key,
                serial_key=spec.serial_key)]  # fmt: skip
        else:
            results = self.app.enqueue_many(specs)
        assert len(results) == len(batch)
        for options, spec, result in zip(batch, specs, results, strict=True):
            assert spec.payload is not None
            self.check_enqueued(options, spec.payload, result, before, spec.run_at)

    # --- consumer ------------------------------------------------------------------------

    @precondition(lambda self: bool(self.jobs_in(WAITING)))
    @rule(
        queues=st.sampled_from((None, "qa", "qb", ("qa", "qb"))),
        limit=st.integers(1, 3),
        lease_seconds=st.sampled_from((None, None, 100, 900)),
        worker=st.sampled_from(("w1", "w2")),
    )
    def lease(
        self,
        queues: str | tuple[str, ...] | None,
        limit: int,
        lease_seconds: int | None,
        worker: str,
    ) -> None:
        now = self.clock.tick()
        names = QUEUES if queues is None else (queues,) if isinstance(queues, str) else queues
        ready = {q: self.leasable(q, now) for q in names if q in self.queues}
        if sum(1 for r in ready.values() if r) > 1:
            # Queues are visited in random order: with a limit below what
            # is ready, which jobs come back would vary from run to run.
            limit = max(limit, sum(len(r) for r in ready.values()))
        got = self.app.lease(
            list(queues) if isinstance(queues, tuple) else queues,
            worker,
            max=limit,
            lease_seconds=lease_seconds,
        )
        self.note(f"lease of {min(len(got), 2)}{'+' if len(got) > 1 else ''} jobs")
        # Queues are visited in random order; inside each, priority desc, run_at, id.
        assert len(got) == min(limit, sum(len(r) for r in ready.values())), (got, ready)
        for q, candidates in ready.items():
            taken = [g.job_id for g in got if g.queue == q]
            assert taken == [j.id for j in candidates[: len(taken)]], (q, taken, candidates)
        # Each lease is a new attempt id, newer than any before it (inside
        # one batch they need not follow the batch's order).
        assert len({g.attempt_id for g in got}) == len(got)
        assert all(g.attempt_id > self.last_attempt_id for g in got), "attempt ids must increase"
        self.last_attempt_id = max((g.attempt_id for g in got), default=self.last_attempt_id)
        for leased in got:
            job = self.model[leased.job_id]
            seconds = lease_seconds or job.spec.lease_seconds
            assert (leased.attempt, leased.task, leased.queue, leased.payload) == (
                job.attempts + 1,
                job.task,
                job.queue,
                job.payload,
            )
            assert leased.lease_expires_at == now + timedelta(seconds=seconds)
            job.status = RUNNING
            job.attempts += 1
            job.attempt_id = leased.attempt_id
            job.lease_expires_at = leased.lease_expires_at
            job.history.append((leased.attempt_id, job.attempts, "running", worker, now, None))
            self.touched.add(job.id)
        # In id order: the order of a batch over two queues varies from run to run.
        self.holders += sorted(got, key=lambda g: g.job_id)

    @precondition(lambda self: bool(self.holders))
    @rule(
        data=st.data(),
        current=PICK_CURRENT,
        how=st.sampled_from(("ack", "ack", "ack_many", "fail", "fail", "nack", "extend")),
        permanent=st.booleans(),
        retry_in=RETRY_IN,
        seconds=st.sampled_from((100, 900)),
    )
    def finish(
        self,
        data: st.DataObject,
        current: bool,
        how: str,
        permanent: bool,
        retry_in: int | None,
        seconds: int,
    ) -> None:
        """A holder acks, fails (``permanent``, ``retry_in``), nacks or extends
        (by ``seconds``), or a few holders ack_many: a current holder changes
        its job, a stale one nothing."""
        if how == "ack_many":
            self.ack_many(data)
            return
        holder = self.pick_holder(data, current)
        now = self.clock.tick()
        self.note(f"{how} by a {'current' if self.holds(holder) else 'stale'} holder")
        if how == "ack":
            self.ack(holder)
        elif how == "fail":
            retry_at = None if retry_in is None else now + timedelta(seconds=retry_in)
            self.fail(holder, now, permanent, retry_at)
        elif how == "nack":
            self.nack(holder)
        else:
            held = self.holds(holder)
            assert self.app.extend(holder, seconds) is held
            if held:
                self.model[holder.job_id].lease_expires_at = now + timedelta(seconds=seconds)

    def ack(self, holder: LeasedJob) -> None:
        job = self.model[holder.job_id]
        result = {"attempt_id": holder.attempt_id}
        if not self.holds(holder):
            with pytest.raises(LeaseLost) as lost:
                self.app.ack(holder, result=result)
            assert lost.value.job_ids == [job.id]
            return
        self.app.ack(holder, result=result)
        self.acked(job, result)

    def acked(self, job: ModelJob, result: Any) -> None:
        if job.cancel_requested:
            self.close(job, "cancelled", "cancelled")
        else:
            self.close(job, "succeeded", "succeeded")
            job.result = result

    def fail(
        self, holder: LeasedJob, now: datetime, permanent: bool, retry_at: datetime | None
    ) -> None:
        job = self.model[holder.job_id]
        if not self.holds(holder):
            with pytest.raises(LeaseLost):
                self.app.fail(holder, "model failure", retry_at=retry_at, permanent=permanent)
            return
        status = self.app.fail(holder, "model failure", retry_at=retry_at, permanent=permanent)
        if job.cancel_requested:
            self.close(job, "cancelled", "cancelled")
            assert status is JobStatus.CANCELLED
        elif permanent or job.attempts >= job.max_attempts:
            self.note("fail: dead")
            self.close(job, "dead", "failed")
            assert status is JobStatus.DEAD
        else:
            self.close(job, WAITING, "failed")
            job.run_at = retry_at or now + job.spec.retry_delay(job.attempts)
            assert status is (JobStatus.SCHEDULED if job.run_at > now else JobStatus.QUEUED)

    def nack(self, holder: LeasedJob) -> None:
        job = self.model[holder.job_id]
        if not self.holds(holder):
            with pytest.raises(LeaseLost):
                self.app.nack(holder)
            return
        self.app.nack(holder)
        if job.cancel_requested:
            self.close(job, "cancelled", "cancelled")
        else:
            self.close(job, WAITING, "released")  # at its old place: run_at is kept
            job.attempts -= 1

    def ack_many(self, data: st.DataObject) -> None:
        """Stale holders are named by LeaseLost; the others are acked."""
        holders = data.draw(
            st.lists(
                st.sampled_from(self.holders), min_size=1, max_size=3, unique_by=lambda h: h.job_id
            )
        )
        self.clock.tick()
        stale = [h.job_id for h in holders if not self.holds(h)]
        fresh = [h for h in holders if self.holds(h)]
        self.touched.update(h.job_id for h in holders)
        self.note(f"ack_many with {'some' if stale else 'no'} stale holders")
        if stale:
            with pytest.raises(LeaseLost) as lost:
                self.app.ack_many(holders)
            assert lost.value.job_ids == stale
        else:
            self.app.ack_many(holders)
        for holder in fresh:
            self.acked(self.model[holder.job_id], None)

    # --- administration ------------------------------------------------------------------

    @rule(
        data=st.data(),
        action=st.sampled_from(("cancel", "cancel", "requeue_dead", "replay", "replay")),
        pick=JOB_PICK,
        queue=st.sampled_from((None, *QUEUES)),
    )
    def administer(
        self, data: st.DataObject, action: str, pick: str | None, queue: str | None
    ) -> None:
        """An operator cancels, requeues (if dead) or replays (into ``queue``) a
        job, preferably one in status ``pick``."""
        self.clock.tick()
        if action == "requeue_dead":
            self.requeue_dead(self.pick_job(data, pick or "dead"))
        elif action == "replay":
            self.replay(self.pick_job(data, pick), queue)
        else:
            self.cancel(self.pick_job(data, pick or RUNNING))

    def replay(self, original: ModelJob, queue: str | None) -> None:
        target_queue = queue or original.queue
        duplicate = self.live_duplicate(target_queue, original.dedup_key)
        before = self.clock.db_now()
        new_id = self.app.replay(original.id, queue=queue)
        self.note(f"replay {'onto a live duplicate' if duplicate else 'as a new job'}")
        if duplicate is not None:
            assert new_id == duplicate.id
            return
        self.add_job(
            ModelJob(
                new_id,
                original.task,
                target_queue,
                original.priority,
                dict(original.payload),
                self.placed_by_database(new_id, before, 0.0),
                original.max_attempts,
                original.dedup_key,
                original.serial_key,
            )
        )

    def cancel(self, job: ModelJob) -> None:
        self.note(f"cancel of a {job.status} job")
        if job.status == WAITING:
            assert self.app.cancel(job.id) is JobStatus.CANCELLED
            job.status = "cancelled"
            job.finished_at = DB_CLOCK
        elif job.status == RUNNING:
            assert self.app.cancel(job.id) is JobStatus.RUNNING
            job.cancel_requested = True
        else:
            with pytest.raises(InvalidJobState) as refused:
                self.app.cancel(job.id)
            assert type(refused.value) is InvalidJobState

    def requeue_dead(self, job: ModelJob) -> None:
        if job.status != "dead":
            self.note("requeue_dead of a job that is not dead")
            with pytest.raises(InvalidJobState) as refused:
                self.app.requeue_dead(job.id)
            assert type(refused.value) is InvalidJobState
            return
        if self.live_duplicate(job.queue, job.dedup_key) is not None:
            self.note("requeue_dead refused: its dedup key is live again")
            with pytest.raises(DuplicateJob):
                self.app.requeue_dead(job.id)
            return
        self.note("requeue_dead of a dead job")
        before = self.clock.db_now()
        self.app.requeue_dead(job.id)
        job.status = WAITING
        job.finished_at = None
        job.run_at = self.placed_by_database(job.id, before, 0.0)
        job.max_attempts = max(job.max_attempts, job.attempts + 1)
        job.cancel_requested = False

    @rule(seconds=st.sampled_from((0, 100, 300, 700, 1500, 4000)), reap=st.booleans())
    def time_passes(self, seconds: int, reap: bool) -> None:
        """The App's clock jumps ``seconds`` ahead (the database's own clock
        does not), then maybe the reaper runs."""
        self.clock.offset += timedelta(seconds=seconds)
        if not reap:
            return
        now = self.clock.tick()
        expired = [
            j
            for j in self.model.values()
            if j.status == RUNNING and j.lease_expires_at is not None and j.lease_expires_at < now
        ]
        self.note(f"reap of {min(len(expired), 2)}{'+' if len(expired) > 1 else ''} jobs")
        assert self.app.reap() == len(expired)
        for job in expired:
            self.touched.add(job.id)
            if job.cancel_requested:
                self.close(job, "cancelled", "cancelled")
            elif job.attempts >= job.max_attempts:
                self.close(job, "dead", "lease_expired")
            else:
                self.close(job, WAITING, "lease_expired")
                job.run_at = now + job.spec.retry_delay(job.attempts)

    # --- checks ----------------------------------------------------------------------------

    def stored_jobs(self) -> list[pgqueue.Job]:
        found: list[pgqueue.Job] = []
        cursor = None
        while True:
            page = self.app.list_jobs(limit=100, cursor=cursor)
            found += page.jobs
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    @invariant()
    def database_matches_the_model(self) -> None:
        """After every step: every job as the model has it, the histories of
        the jobs the step touched, the rules that must hold in the
        database whatever the model says, and the metrics."""
        stored = {job.id: job for job in self.stored_jobs()}
        assert sorted(stored) == sorted(self.model), "jobs appeared or vanished"
        for job_id, job in self.model.items():
            row = stored[job_id]
            status = WAITING if row.status in ("queued", "scheduled") else row.status.value
            seen = (status, row.attempts, row.max_attempts, row.queue, row.task, row.priority,
                    row.dedup_key, row.serial_key, row.payload)  # fmt: skip
            want = (job.status, job.attempts, job.max_attempts, job.queue, job.task,
                    job.priority, job.dedup_key, job.serial_key, job.payload)  # fmt: skip
            assert seen == want, f"job {job_id}: database {seen}, model {want}"
            if job.status == WAITING:
                assert row.run_at == job.run_at, f"job {job_id}: run_at {row.run_at}"
            assert row.result == job.result, f"job {job_id}: result {row.result}"
            if job.finished_at is DB_CLOCK:
                assert row.finished_at is not None, f"job {job_id}: no finished_at"
            else:
                assert row.finished_at == job.finished_at, f"job {job_id}: {row.finished_at}"
        self.check_histories(self.touched)
        self.touched = set()
        self.check_design_rules(list(stored.values()))
        self.check_metrics()

    def check_design_rules(self, stored: list[pgqueue.Job]) -> None:
        live = [j for j in stored if j.status in LIVE_STATUSES and j.dedup_key is not None]
        keys = [(j.queue, j.dedup_key) for j in live]
        assert len(keys) == len(set(keys)), f"two live jobs share a dedup key: {keys}"
        running = [j.serial_key for j in stored if j.status is JobStatus.RUNNING and j.serial_key]
        assert len(running) == len(set(running)), f"a serial key runs twice: {running}"
        # The visible status follows the database clock (not the App's).
        now = self.clock.db_now()
        for job in stored:
            if abs(job.run_at - now) < DB_CLOCK_TOLERANCE:
                continue  # too close to call from here
            if job.status is JobStatus.SCHEDULED:
                assert job.run_at > now, f"job {job.id} is scheduled but due"
            elif job.status is JobStatus.QUEUED:
                assert job.run_at < now, f"job {job.id} is queued but not yet due"

    def check_metrics(self) -> None:
        metrics = self.app.metrics()
        for queue in self.queues:
            jobs = [j for j in self.model.values() if j.queue == queue]
            got = metrics[queue]
            counts = {s: sum(1 for j in jobs if j.status == s) for s in MODEL_STATUSES}
            seen = (got.queued + got.scheduled, got.running, got.dead, got.cancelled)
            want = (counts[WAITING], counts[RUNNING], counts["dead"], counts["cancelled"])
            assert seen == want, f"metrics of {queue}: {got}, model (waiting, running, ...) {want}"

    def check_histories(self, job_ids: Iterable[int]) -> None:
        for job_id in sorted(job_ids):
            history = self.app.get_job(job_id, history=True).attempt_history
            assert history is not None
            seen = [
                (a.attempt_id, a.attempt, a.outcome.value, a.worker_id, a.started_at, a.finished_at)
                for a in history
            ]
            assert seen == self.model[job_id].history, f"job {job_id}: attempt history"

    def teardown(self) -> None:
        self.check_histories(self.model)


def database_skew(conn: psycopg.Connection[Any]) -> timedelta:
    """The database clock minus ours (zero on one machine; not behind a remote server)."""
    before = datetime.now(UTC)
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    after = datetime.now(UTC)
    assert row is not None
    db_time: datetime = row[0]
    return db_time - (before + (after - before) / 2)


def register_tasks(app: pgqueue.App, tasks: Sequence[TaskSpec]) -> None:
    for spec in tasks:
        app.task(
            name=spec.name,
            max_attempts=spec.max_attempts,
            lease_seconds=spec.lease_seconds,
            retry=spec.backoff,
        )(never_run)


def test_the_queue_follows_its_model(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        clock = SteppingClock(database_skew(conn))
        with pgqueue.App(db_dsn, clock=clock, pool_min_size=1, pool_max_size=2) as app:
            register_tasks(app, list(TASKS.values()))
            harness = Harness(app, conn, clock)

            class BoundQueueMachine(QueueMachine):
                pass

            BoundQueueMachine.harness = harness
            try:
                run_state_machine_as_test(BoundQueueMachine, settings=SETTINGS)
            finally:
                print("paths exercised:", dict(sorted(harness.paths.items())))


def test_ack_many_names_a_stale_holder_listed_beside_the_current_one(db_dsn: str) -> None:
    """The model draws ack_many holders of distinct jobs; this is the case it
    leaves out: one consumer presents both its reaped lease and its new one."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        clock = SteppingClock(database_skew(conn))
    with pgqueue.App(db_dsn, clock=clock) as app:
        register_tasks(app, [TASKS["fast"]])
        job_id = app.enqueue("fast", {}, queue="qa").job_id
        clock.tick()
        (stale,) = app.lease("qa", "w1", lease_seconds=100)
        clock.offset += timedelta(seconds=1000)
        clock.tick()
        assert app.reap() == 1  # back to the queue at once (no backoff)
        (current,) = app.lease("qa", "w1")
        assert (current.job_id, current.attempt) == (job_id, 2)

        with pytest.raises(LeaseLost) as lost:
            app.ack_many([stale, current])

        assert lost.value.job_ids == [job_id]
        job = app.get_job(job_id, history=True)
        assert job.status is JobStatus.SUCCEEDED  # by the current holder
        assert job.attempt_history is not None
        assert [a.attempt_id for a in job.attempt_history] == [stale.attempt_id, current.attempt_id]
