"""What must hold after a fault-injection run, checked from the database and
from the side-effect log the tasks wrote (``public.chaos_effects``).

Storage rule (see sql/schema.sql): a job's current or final
successful attempt lives in its ``jobs`` row (attempt_id, worker_id,
attempt_started_at, finished_at); every other attempt is a row of
``job_attempts``. :func:`merged_history` puts them together the way
``App.get_job(id, history=True).attempt_history`` does; the test cross-checks
the two on a sample.

The checks, per job:

- it ended ``succeeded`` or ``dead``; every enqueued key is there exactly once;
- its counted attempts (all but ``released``) are numbered 1..n with n equal
  to ``jobs.attempts``; a released attempt carries the number the next
  counted attempt reuses;
- no two attempts overlapped while both held the lease: a lease is held from
  the attempt's start until its record was closed (ack, fail, nack or the
  reaper), so in attempt-id order each attempt starts no earlier than the
  previous one was closed;
- no stale ack was accepted: the attempt id in the ``jobs`` row is the
  newest of the job, every ``job_attempts`` id is distinct and older; the run
  behind a succeeded attempt wrote its side effect and ended before the ack;
- no run happened without a lease: each side effect names an attempt of its
  job, started no earlier than that attempt, and each attempt ran in one
  process at most;
- every succeeded job's side effect happened at least once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg

FINAL = ("succeeded", "dead")
UNCOUNTED = "released"
FAILING_BEHAVIOURS = ("raise", "retry", "permanent")  # see tests/apps/chaos.py
RELEASE_STAMP_SLACK = timedelta(milliseconds=50)  # see _slack


@dataclass(frozen=True, slots=True)
class JobRow:
    id: int
    key: int
    task: str
    status: str
    attempts: int
    max_attempts: int
    attempt_id: int | None
    attempt_started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    attempt_id: int
    job_id: int
    attempt: int
    outcome: str
    started_at: datetime
    finished_at: datetime | None
    worker_id: str | None
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class Effect:
    job_id: int
    attempt_id: int
    attempt: int
    pid: int
    behaviour: str
    started_at: datetime
    ended_at: datetime | None


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    def add(self, job_id: int | None, message: str) -> None:
        self.violations.append(f"job {job_id}: {message}" if job_id is not None else message)

    def describe(self, limit: int = 25) -> str:
        shown = "\n".join(self.violations[:limit])
        more = len(self.violations) - limit
        return shown + (f"\n... and {more} more" if more > 0 else "")


def load(dsn: str) -> tuple[list[JobRow], list[AttemptRow], list[Effect]]:
    """Every job, every job_attempts row and every side effect of the database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = [
            JobRow(*row)
            for row in conn.execute(
                "SELECT id, (payload->>'key')::int, task, status::text, attempts, max_attempts,"
                " attempt_id, attempt_started_at, finished_at, worker_id FROM pgqueue.jobs"
            )
        ]
        attempts = [
            AttemptRow(*row)
            for row in conn.execute(
                "SELECT id, job_id, attempt, outcome::text, started_at, finished_at, worker_id,"
                " error_code FROM pgqueue.job_attempts"
            )
        ]
        effects = [
            Effect(*row)
            for row in conn.execute(
                "SELECT job_id, attempt_id, attempt, pid, behaviour, started_at, ended_at"
                " FROM public.chaos_effects"
            )
        ]
    return jobs, attempts, effects


def merged_history(job: JobRow, recorded: Iterable[AttemptRow]) -> list[AttemptRow]:
    """The job's attempts, oldest first: job_attempts rows plus the attempt
    held in the jobs row when it is running or the final successful one."""
    history = list(recorded)
    if job.status in ("running", "succeeded") and job.attempt_id is not None:
        assert job.attempt_started_at is not None
        history.append(
            AttemptRow(
                job.attempt_id,
                job.id,
                job.attempts,
                job.status,
                job.attempt_started_at,
                job.finished_at if job.status == "succeeded" else None,
                job.worker_id,
            )
        )
    return sorted(history, key=lambda a: a.attempt_id)


def check(
    jobs: Sequence[JobRow],
    attempts: Sequence[AttemptRow],
    effects: Sequence[Effect],
    expected_keys: Iterable[int],
) -> Report:
    report = Report()
    by_job: dict[int, list[AttemptRow]] = defaultdict(list)
    for a in attempts:
        by_job[a.job_id].append(a)
    effects_by_job: dict[int, list[Effect]] = defaultdict(list)
    for e in effects:
        effects_by_job[e.job_id].append(e)

    keys = Counter(j.key for j in jobs)
    expected = set(expected_keys)
    if missing := sorted(expected - set(keys)):
        report.add(None, f"{len(missing)} enqueued jobs are missing, e.g. keys {missing[:10]}")
    if extra := sorted(set(keys) - expected):
        report.add(None, f"{len(extra)} unexpected jobs, e.g. keys {extra[:10]}")
    if doubled := sorted(k for k, n in keys.items() if n > 1):
        report.add(None, f"{len(doubled)} keys were enqueued twice, e.g. {doubled[:10]}")
    known_jobs = {j.id for j in jobs}
    if orphans := sorted(set(by_job) - known_jobs):
        report.add(None, f"job_attempts rows of unknown jobs {orphans[:10]}")

    for job in jobs:
        report.stats[f"status:{job.status}"] += 1
        if job.status not in FINAL:
            report.add(job.id, f"ended {job.status!r}, not succeeded or dead")
        history = merged_history(job, by_job.get(job.id, []))
        for a in history:
            report.stats[f"outcome:{a.outcome}"] += 1
        report.stats[f"attempts:{job.attempts}"] += 1
        _check_numbering(report, job, history)
        _check_no_overlap(report, job, history)
        _check_final_attempt(report, job, history)
        _check_effects(report, job, history, effects_by_job.get(job.id, []))
    return report


def _check_numbering(report: Report, job: JobRow, history: list[AttemptRow]) -> None:
    counted = 0
    for a in history:
        if a.outcome == UNCOUNTED:
            if a.attempt != counted + 1:
                report.add(
                    job.id,
                    f"released attempt {a.attempt_id} numbered {a.attempt}, expected "
                    f"{counted + 1} (the number the next attempt reuses)",
                )
            continue
        counted += 1
        if a.attempt != counted:
            numbers = [(x.attempt, x.outcome) for x in history]
            report.add(job.id, f"attempts are not the gapless sequence 1..n: {numbers}")
            return
    if counted != job.attempts:
        report.add(job.id, f"jobs.attempts = {job.attempts} but {counted} attempts are recorded")
    if job.attempts > job.max_attempts:
        report.add(job.id, f"{job.attempts} attempts ran, more than max_attempts")


def _slack(previous: AttemptRow) -> timedelta:
    """How far a lease's recorded start may precede the close of the attempt
    before it. lease_jobs stamps started_at with clock_timestamp() when the
    function starts, before its scan sees the rows other transactions committed
    meanwhile; a nack leaves its job due at once (a failure or a reap puts it
    at least the backoff ahead), so a lease that started just before a nack
    committed can pick the job up with a start stamped a moment before the nack.
    That is a timestamp taken early, not two holders."""
    return RELEASE_STAMP_SLACK if previous.outcome == UNCOUNTED else timedelta(0)


def _check_no_overlap(report: Report, job: JobRow, history: list[AttemptRow]) -> None:
    previous: AttemptRow | None = None
    for a in history:
        if a.finished_at is None:
            report.add(job.id, f"attempt {a.attempt_id} ({a.outcome}) was never closed")
            return
        if a.finished_at < a.started_at:
            report.add(job.id, f"attempt {a.attempt_id} closed before it started")
        if (
            previous is not None
            and previous.finished_at is not None
            and a.started_at < previous.finished_at - _slack(previous)
        ):
            report.add(
                job.id,
                f"attempt {a.attempt_id} (started {a.started_at.isoformat()}) overlaps "
                f"attempt {previous.attempt_id} ({previous.outcome}, lease held until "
                f"{previous.finished_at.isoformat()})",
            )
        previous = a


def _check_final_attempt(report: Report, job: JobRow, history: list[AttemptRow]) -> None:
    if not history:
        report.add(job.id, f"{job.status} without any attempt")
        return
    newest = history[-1]
    if job.attempt_id != newest.attempt_id:
        report.add(
            job.id,
            f"the jobs row names attempt {job.attempt_id} but attempt "
            f"{newest.attempt_id} ({newest.outcome}) is newer: a stale outcome was accepted",
        )
    if len({a.attempt_id for a in history}) != len(history):
        report.add(job.id, "an attempt id appears twice")
    if job.status == "succeeded":
        if newest.outcome != "succeeded":
            report.add(job.id, f"succeeded, but its newest attempt ended {newest.outcome}")
        if others := [a for a in history[:-1] if a.outcome == "succeeded"]:
            report.add(job.id, f"more than one succeeded attempt: {others}")
    elif job.status == "dead":
        if newest.outcome not in ("failed", "retry", "lease_expired", "timeout"):
            report.add(job.id, f"dead, but its newest attempt ended {newest.outcome}")
        permanent = newest.error_code in ("Permanent", "unknown_task", "invalid_payload")
        if not permanent and job.attempts < job.max_attempts:
            report.add(
                job.id,
                f"dead after {job.attempts} of {job.max_attempts} attempts without a "
                f"permanent error (last: {newest.error_code})",
            )


def _check_effects(
    report: Report, job: JobRow, history: list[AttemptRow], effects: list[Effect]
) -> None:
    attempts = {a.attempt_id: a for a in history}
    runs_per_attempt: Counter[int] = Counter()
    for e in effects:
        report.stats["runs"] += 1
        runs_per_attempt[e.attempt_id] += 1
        a = attempts.get(e.attempt_id)
        if a is None:
            report.add(job.id, f"a run under attempt id {e.attempt_id}, which the job never had")
            continue
        if e.attempt != a.attempt:
            report.add(job.id, f"run of attempt {e.attempt_id} saw attempt number {e.attempt}")
        if e.started_at < a.started_at:
            report.add(job.id, f"run of attempt {e.attempt_id} started before its lease")
        if e.ended_at is None:
            report.stats["runs_cut_short"] += 1  # its worker was killed mid-run
        elif a.finished_at is not None and e.ended_at > a.finished_at:
            # It outlived its lease (reaped while it ran): a "zombie" run,
            # whose outcome the fencing had to refuse.
            report.stats["runs_outliving_their_lease"] += 1
            if a.outcome == "succeeded":
                report.add(job.id, f"attempt {a.attempt_id} was acked before its run ended")
    if doubled := [i for i, n in runs_per_attempt.items() if n > 1]:
        report.add(job.id, f"attempts {doubled} ran in more than one process")
    if job.status == "succeeded":
        final = [e for e in effects if e.attempt_id == job.attempt_id and e.ended_at is not None]
        if not final:
            report.add(
                job.id, f"succeeded, but the run of attempt {job.attempt_id} left no side effect"
            )
        elif final[0].behaviour in FAILING_BEHAVIOURS:
            report.add(job.id, f"succeeded by a run that was to {final[0].behaviour!r}")
