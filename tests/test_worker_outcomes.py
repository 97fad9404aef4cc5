"""How a real worker records each way a task can end: return, Retry, Permanent,
another exception, timeout, unknown task, payload that does not fit."""

from __future__ import annotations

import pytest

import pgqueue
from pgqueue import AttemptOutcome, JobStatus
from tests.fixtures.workers import (
    TASKS_APP,
    WorkerProcess,
    Workers,
    pgqueue_command,
    task_events,
    wait_until,
)


def test_sync_and_async_tasks_succeed_with_their_return_value_stored(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn().wait_registered()
    sync_id = tasks_app.enqueue("echo", {"value": {"n": [1, 2], "s": "x"}}).job_id
    async_id = tasks_app.enqueue("async_echo", {"value": 7}).job_id

    jobs = workers.wait_finished(tasks_app, [sync_id, async_id])

    for job_id, expected in ((sync_id, {"n": [1, 2], "s": "x"}), (async_id, {"async": 7})):
        job = jobs[job_id]
        assert job.status is JobStatus.SUCCEEDED
        assert job.result == expected
        assert job.attempts == 1
        assert job.finished_at is not None
        assert job.attempt_history is not None
        [attempt] = job.attempt_history
        assert attempt.outcome is AttemptOutcome.SUCCEEDED
        assert attempt.attempt == 1
        assert attempt.error_code is None
        assert attempt.latency_ms is not None
        assert attempt.latency_ms >= 0
        assert attempt.worker_id  # the worker that ran it


def test_result_waits_for_a_running_job_and_returns_its_value(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("async_nap", {"key": "r", "seconds": 1.0}).job_id

    assert tasks_app.result(job_id, timeout=30) == "r"
    assert tasks_app.get_job(job_id).status is JobStatus.SUCCEEDED


def test_result_of_a_dead_job_raises_with_its_last_error(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("give_up", {"message": "card declined"}).job_id

    with pytest.raises(pgqueue.JobFailed, match="card declined") as raised:
        tasks_app.result(job_id, timeout=30)
    assert raised.value.job_id == job_id


def test_retry_reruns_the_job_after_the_requested_delay(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("retry_once", {"delay": 0.5}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.SUCCEEDED
    assert job.result == 2
    assert job.attempts == 2  # Retry counts as an attempt
    assert job.attempt_history is not None
    first, second = job.attempt_history
    assert first.outcome is AttemptOutcome.RETRY
    assert second.outcome is AttemptOutcome.SUCCEEDED
    assert (first.attempt, second.attempt) == (1, 2)
    assert first.finished_at is not None
    # Not before the requested delay (both times come from the database's clock).
    assert (second.started_at - first.finished_at).total_seconds() >= 0.5 - 0.01


def test_permanent_dead_letters_at_once(workers: Workers, tasks_app: pgqueue.App) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("give_up", {"message": "no such account"}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.DEAD
    assert job.attempts == 1
    assert job.max_attempts == 5
    assert job.last_error is not None
    assert "no such account" in job.last_error
    assert job.attempt_history is not None
    [attempt] = job.attempt_history
    assert attempt.outcome is AttemptOutcome.FAILED
    assert attempt.error_code == "Permanent"
    assert attempt.error_message == "no such account"


def test_an_exception_retries_with_backoff_then_dead_letters_with_the_error(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("boom", {"message": "disk on fire"}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.DEAD
    assert job.attempts == job.max_attempts == 3
    assert job.attempt_history is not None
    assert [a.outcome for a in job.attempt_history] == [AttemptOutcome.FAILED] * 3
    assert [a.attempt for a in job.attempt_history] == [1, 2, 3]
    for attempt in job.attempt_history:
        assert attempt.error_code == "ValueError"
        assert attempt.error_message == "disk on fire"
        assert attempt.traceback is not None
        assert "ValueError: disk on fire" in attempt.traceback
        assert "in boom" in attempt.traceback
    # Backoff(base=0.2, factor=2, jitter=0): at least 0.2 s, then 0.4 s between attempts.
    gaps = [
        (later.started_at - earlier.finished_at).total_seconds()
        for earlier, later in zip(job.attempt_history, job.attempt_history[1:], strict=False)
        if earlier.finished_at is not None
    ]
    assert len(gaps) == 2
    assert gaps[0] >= 0.2 - 0.01
    assert gaps[1] >= 0.4 - 0.01
    assert job.last_error is not None
    assert "disk on fire" in job.last_error


def test_async_task_over_its_timeout_is_cancelled_and_the_attempt_times_out(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("async_too_slow", {"key": "t"}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.DEAD  # max_attempts=1
    assert job.attempt_history is not None
    [attempt] = job.attempt_history
    assert attempt.outcome is AttemptOutcome.TIMEOUT
    assert attempt.error_code == "timeout"
    # The coroutine saw the cancellation (its handler wrote the event).
    workers_log = task_events(workers.dsn, key="t")
    assert [e["kind"] for e in workers_log] == ["start", "cancelled"]


def test_sync_task_over_its_timeout_keeps_its_slot_until_it_returns(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    workers.spawn("--concurrency", "1").wait_registered()
    slow_id = tasks_app.enqueue("sync_too_slow", {"key": "slow", "seconds": 3.0}).job_id
    next_id = tasks_app.enqueue("nap", {"key": "next", "seconds": 0}).job_id

    jobs = workers.wait_finished(tasks_app, [slow_id, next_id])

    slow = jobs[slow_id]
    assert slow.status is JobStatus.DEAD
    assert slow.attempt_history is not None
    [attempt] = slow.attempt_history
    assert attempt.outcome is AttemptOutcome.TIMEOUT
    assert attempt.error_code == "timeout"
    assert jobs[next_id].status is JobStatus.SUCCEEDED
    [slow_end] = task_events(workers.dsn, "end", "slow")
    [next_start] = task_events(workers.dsn, "start", "next")
    # The abandoned thread kept the only slot: the next job started after it returned.
    assert next_start["at"] >= slow_end["at"]
    # The timeout itself was recorded when it struck, not when the thread returned.
    assert attempt.finished_at is not None
    assert attempt.finished_at < slow_end["at"]


def test_unknown_task_is_dead_lettered(workers: Workers, tasks_app: pgqueue.App) -> None:
    # Without a grace period and with no live worker that knows the task
    # (the default grace hands it back for an hour: test_task_registry*).
    workers.spawn("--unknown-task-grace", "0s").wait_registered()
    job_id = tasks_app.enqueue("no_such_task", {"x": 1}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.DEAD
    assert job.attempts == 1
    assert job.attempt_history is not None
    [attempt] = job.attempt_history
    assert attempt.outcome is AttemptOutcome.FAILED
    assert attempt.error_code == "unknown_task"
    assert attempt.error_message is not None
    assert "no_such_task" in attempt.error_message


@pytest.mark.parametrize(
    "payload", [{"wrong": 1}, {}, {"value": 1, "extra": 2}], ids=["unknown", "missing", "extra"]
)
def test_payload_not_matching_the_signature_is_dead_lettered(
    workers: Workers, tasks_app: pgqueue.App, payload: dict[str, int]
) -> None:
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("echo", payload).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.DEAD
    assert job.attempts == 1  # not retried: it can never succeed
    assert job.attempt_history is not None
    [attempt] = job.attempt_history
    assert attempt.outcome is AttemptOutcome.FAILED
    assert attempt.error_code == "invalid_payload"


def test_a_type_error_raised_inside_the_task_is_an_ordinary_failure(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    # The payload fits the signature: a TypeError from the task's own code is
    # retried like any exception, not taken for an invalid payload.
    workers.spawn().wait_registered()
    job_id = tasks_app.enqueue("type_error_inside", {"value": 3}).job_id

    job = workers.wait_finished(tasks_app, [job_id])[job_id]

    assert job.status is JobStatus.DEAD
    assert job.attempts == 2
    assert job.attempt_history is not None
    assert [a.error_code for a in job.attempt_history] == ["TypeError", "TypeError"]
    assert [a.error_message for a in job.attempt_history] == ["bad value 3"] * 2


def test_every_log_line_about_a_job_names_it(workers: Workers, tasks_app: pgqueue.App) -> None:
    worker = workers.spawn("--log-level", "debug")
    worker.wait_registered()
    ok = tasks_app.enqueue("echo", {"value": 1}).job_id
    bad = tasks_app.enqueue("give_up", {"message": "nope"}).job_id
    workers.wait_finished(tasks_app, [ok, bad])

    def lines_for(job_id: int) -> list[dict[str, object]]:
        return [e for e in worker.log_events() if e.get("job_id") == job_id]

    finished = wait_until_logged(worker, ok, "job succeeded")
    assert finished["task"] == "echo"
    assert finished["queue"] == "default"
    assert finished["attempt"] == 1
    assert isinstance(finished["duration_ms"], int | float)
    assert finished["outcome"] == "succeeded"
    failed = wait_until_logged(worker, bad, "job failed")
    assert (failed["task"], failed["queue"], failed["attempt"]) == ("give_up", "default", 1)
    assert failed["error_code"] == "Permanent"
    assert "duration_ms" in failed
    for job_id in (ok, bad):
        for line in lines_for(job_id):
            assert {"task", "queue", "attempt"} <= line.keys(), line


def wait_until_logged(worker: WorkerProcess, job_id: int, event: str) -> dict[str, object]:
    def found() -> dict[str, object] | None:
        lines = [e for e in worker.logged(event) if e.get("job_id") == job_id]
        return lines[0] if lines else None

    return wait_until(found, 15, f"{event!r} for job {job_id}", [worker])


def test_logs_are_json_off_a_tty_and_follow_the_log_level(
    workers: Workers, tasks_app: pgqueue.App
) -> None:
    worker = workers.spawn(
        command=[*pgqueue_command(), "worker", "--app", TASKS_APP, "--log-level", "warning"]
    )
    worker.wait_registered()
    ok = tasks_app.enqueue("echo", {"value": 1}).job_id
    bad = tasks_app.enqueue("give_up", {"message": "nope"}).job_id
    workers.wait_finished(tasks_app, [ok, bad])

    failed = wait_until_logged(worker, bad, "job failed")  # a JSON line (stdout is a file)
    assert failed["level"] == "warning"
    assert worker.logged("job succeeded") == []  # info: below --log-level warning
