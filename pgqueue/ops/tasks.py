"""Task registry, live task settings and limits, task statistics, workers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pgqueue import validation
from pgqueue.durations import parse_duration
from pgqueue.errors import InvalidOption, TaskNotFound
from pgqueue.models import TaskInfo, TaskSettings, TaskStats, UnknownTaskJobs, WorkerInfo
from pgqueue.ops import Execute, Op
from pgqueue.ops.admin import parse_rate
from pgqueue.retry import Backoff


class PublishedTask(Protocol):
    """What :func:`publish` reads of a task (a :class:`pgqueue.Task`)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def lease_seconds(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def retry(self) -> Backoff: ...


#: A worker whose heartbeat is older than this counts as not alive.
ALIVE_SECONDS = 60.0
#: Default window of task_stats.
STATS_WINDOW = timedelta(hours=24)
#: The fields set_task_options can set or clear (clear: pass ``None`` in ``unset``).
OPTION_FIELDS = ("max_attempts", "timeout", "lease_seconds", "priority", "retry")


def publish(tasks: Sequence[PublishedTask], worker_id: str) -> Op[None]:
    """Publish ``tasks`` (name, queue, declared defaults) as ``worker_id``'s."""
    if not tasks:
        return
    backoffs = [t.retry for t in tasks]
    yield Execute(
        "task_publish",
        {
            "worker_id": worker_id,
            "names": [t.name for t in tasks],
            "queues": [t.queue for t in tasks],
            "priorities": [t.priority for t in tasks],
            "max_attempts": [t.max_attempts for t in tasks],
            "lease_seconds": [t.lease_seconds for t in tasks],
            "timeouts": [float(t.timeout) if t.timeout is not None else None for t in tasks],
            "b1": [float(b.base) for b in backoffs],
            "b2": [float(b.factor) for b in backoffs],
            "b3": [float(b.max) for b in backoffs],
            "b4": [float(b.jitter) for b in backoffs],
        },
        fetch="none",
    )


def set_options(
    task: str,
    options: dict[str, Any],
    unset: Sequence[str] = (),
) -> Op[None]:
    """Set live settings of ``task`` (keys of OPTION_FIELDS; a None value is
    left as it is) and clear the fields named in ``unset``."""
    name = validation.task_name(task)
    unknown = set(options) - set(OPTION_FIELDS)
    unknown |= set(unset) - set(OPTION_FIELDS)
    if unknown:
        raise InvalidOption(
            f"unknown task option(s) {sorted(unknown)}: use {', '.join(OPTION_FIELDS)}"
        )
    both = {k for k, v in options.items() if v is not None} & set(unset)
    if both:
        raise InvalidOption(f"cannot set and unset {sorted(both)} at once")
    if not any(v is not None for v in options.values()) and not unset:
        raise InvalidOption("nothing to set: give at least one option")
    retry = options.get("retry")
    if retry is not None and not isinstance(retry, Backoff):
        raise InvalidOption("retry must be a pgqueue.Backoff")
    lease = options.get("lease_seconds")
    timeout = options.get("timeout")
    params = {
        "name": name,
        "max_attempts": validation.max_attempts(options["max_attempts"])
        if options.get("max_attempts") is not None
        else None,
        "lease_seconds": max(1, round(validation.seconds("lease_seconds", lease, allow_zero=False)))
        if lease is not None
        else None,
        "timeout_seconds": validation.seconds("timeout", timeout, allow_zero=False)
        if timeout is not None
        else None,
        "priority": validation.priority(options["priority"])
        if options.get("priority") is not None
        else None,
        "backoff": [retry.base, retry.factor, retry.max, retry.jitter] if retry else None,
        "clear": list(unset),
    }
    return _upsert(params)


def _upsert(params: dict[str, Any]) -> Op[None]:
    yield Execute("task_settings_upsert", params)
    yield Execute("task_settings_prune", {"name": params["name"]}, fetch="none")


def set_limit(task: str, concurrency: int | None = None, rate: str | None = None) -> Op[None]:
    """Set (or with None, lift) a task's concurrency and rate limits."""
    name = validation.task_name(task)
    rate_limit, rate_period = parse_rate(rate) if rate is not None else (None, None)
    params = {
        "name": name,
        "concurrency": validation.positive_int("concurrency", concurrency)
        if concurrency is not None
        else None,
        "rate_limit": rate_limit,
        "rate_period": timedelta(seconds=rate_period) if rate_period is not None else None,
    }
    return _limits(params)


def _limits(params: dict[str, Any]) -> Op[None]:
    yield Execute("task_limits_set", params)
    yield Execute("task_settings_prune", {"name": params["name"]}, fetch="none")


def _rate_text(limit: int | None, seconds: float | None) -> str | None:
    if limit is None or seconds is None:
        return None
    return f"{limit}/{seconds:g}s"


def _settings(row: dict[str, Any], prefix: str = "") -> TaskSettings:
    return TaskSettings(
        max_attempts=row[f"{prefix}max_attempts"],
        lease_seconds=row[f"{prefix}lease_seconds"],
        timeout=row[f"{prefix}timeout_seconds"],
        priority=row[f"{prefix}priority"],
        retry=list(row[f"{prefix}backoff"]) if row[f"{prefix}backoff"] is not None else None,
        concurrency=row["concurrency_limit"],
        rate=_rate_text(row["rate_limit"], row["rate_period_seconds"]),
    )


def all_settings() -> Op[dict[str, TaskSettings]]:
    """Every task's operator settings (what a worker caches)."""
    rows = yield Execute("task_settings_all", rows="dict")
    return {row["name"]: _settings(row) for row in rows}


def list_tasks(name: str | None = None) -> Op[list[TaskInfo]]:
    """Tasks published by workers or with settings (one when ``name`` is given)."""
    if name is not None:
        name = validation.task_name(name)
    return _list(name)


def _list(name: str | None) -> Op[list[TaskInfo]]:
    rows = yield Execute("task_list", {"name": name, "alive_seconds": ALIVE_SECONDS}, rows="dict")
    return [
        TaskInfo(
            name=r["name"],
            queue=r["queue"],
            priority=r["priority"],
            max_attempts=r["max_attempts"],
            lease_seconds=r["lease_seconds"],
            timeout=r["timeout_seconds"],
            retry=list(r["backoff"]) if r["backoff"] is not None else None,
            published_by=r["published_by"],
            first_seen_at=r["first_seen_at"],
            last_seen_at=r["last_seen_at"],
            settings=_settings(r, "set_"),
            workers=list(r["workers"]),
            running=int(r["running"]),
        )
        for r in rows
    ]


def get_task(name: str) -> Op[TaskInfo]:
    """One task; raises TaskNotFound when the database does not know it."""
    found = yield from list_tasks(name)
    if not found:
        raise TaskNotFound(f"no task named {name!r} was published by a worker or has settings")
    return found[0]


def since_time(since: datetime | timedelta | str | float | None) -> datetime:
    """The start of a statistics window: a datetime, or an age (``"1h"``,
    seconds, timedelta) before now; None: the last 24 hours."""
    if since is None:
        return datetime.now(UTC) - STATS_WINDOW
    if isinstance(since, datetime):
        return validation.aware("since", since)
    if isinstance(since, str):
        return datetime.now(UTC) - parse_duration(since)
    return datetime.now(UTC) - timedelta(seconds=validation.seconds("since", since))


def task_stats(
    task: str | None = None,
    since: datetime | timedelta | str | float | None = None,
    *,
    sample: int | None = None,
) -> Op[dict[str, TaskStats]]:
    """Per-task run statistics since ``since`` (default: the last 24 hours);
    ``sample``: over at most about that many of the newest finished jobs
    (the window then starts later; see ``TaskStats.window_start``)."""
    name = validation.task_name(task) if task is not None else None
    if sample is not None:
        sample = validation.positive_int("sample", sample)
    return _stats(name, since_time(since), sample)


def _stats(task: str | None, since: datetime, sample: int | None) -> Op[dict[str, TaskStats]]:
    if sample is not None:
        # A separate statement: the window's start as a parameter lets the
        # planner see how narrow it is (index ranges, not a scan).
        start = yield Execute("task_stats_window", {"since": since, "sample": sample}, fetch="one")
        since = start[0] if start and start[0] is not None else since
    rows = yield Execute(
        "task_stats", {"task": task, "since": since, "sample": sample}, rows="dict"
    )
    return {
        r["task"]: TaskStats(
            task=r["task"],
            runs=int(r["runs"]),
            succeeded=int(r["succeeded"]),
            failed=int(r["failed"]),
            dead=int(r["dead"]),
            cancelled=int(r["cancelled"]),
            retries=int(r["retries"]),
            duration_p50=r["duration_p50"],
            duration_p95=r["duration_p95"],
            duration_max=r["duration_max"],
            wait_p50=r["wait_p50"],
            wait_p95=r["wait_p95"],
            wait_max=r["wait_max"],
            last_error=r["last_error"],
            window_start=r["window_start"],
        )
        for r in rows
    }


def unknown_tasks() -> Op[list[UnknownTaskJobs]]:
    """Tasks of live jobs that no live worker knows (for status and doctor)."""
    rows = yield Execute("task_unknown_waiting", {"alive_seconds": ALIVE_SECONDS}, rows="dict")
    return [UnknownTaskJobs(r["task"], int(r["jobs"]), r["oldest_age_seconds"]) for r in rows]


def list_workers() -> Op[list[WorkerInfo]]:
    """Registered workers with their state (alive, stale, lost)."""
    rows = yield Execute("worker_list_states", {"seconds": ALIVE_SECONDS}, rows="dict")
    return [
        WorkerInfo(
            id=r["id"],
            host=r["host"],
            pid=r["pid"],
            queues=r["queues"],
            concurrency=r["concurrency"],
            tasks=r["tasks"],
            started_at=r["started_at"],
            last_heartbeat_at=r["last_heartbeat_at"],
            lost_at=r["lost_at"],
            heartbeat_age_seconds=r["heartbeat_age_seconds"],
            state=r["state"],
            running=int(r["running"]),
            version=r["version"],
            pool=r["pool"],
        )
        for r in rows
    ]


def forget_worker(worker_id: str, force: bool = False) -> Op[bool]:
    """Remove a worker's registration; refused (False) while it is alive
    unless ``force``. Its running jobs are left to the reaper."""
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidOption("worker_id must be a non-empty string")
    return _forget(worker_id, bool(force))


def _forget(worker_id: str, force: bool) -> Op[bool]:
    rows = yield Execute(
        "worker_forget", {"worker_id": worker_id, "force": force, "seconds": ALIVE_SECONDS}
    )
    return bool(rows)


def mark_lost(seconds: float) -> Op[list[str]]:
    """Declare workers silent for ``seconds`` lost."""
    rows = yield Execute("worker_mark_lost", {"seconds": seconds})
    return [r[0] for r in rows]


def prune_lost(seconds: float) -> Op[list[str]]:
    """Forget workers lost for over ``seconds`` whose jobs were all reaped."""
    rows = yield Execute("worker_prune_lost", {"seconds": seconds})
    return [r[0] for r in rows]
