"""``pgqueue worker --pool process`` with real processes: sync tasks run in
child processes (async ones on the worker's loop), hard timeouts kill
sleeping and spinning tasks, a dead child fails its attempt
``worker_crashed`` and the retry succeeds in a new child, a cancel stops a
child that ignores ``should_stop()``, children are replaced after
``--max-tasks-per-child`` tasks or ``--max-memory-per-child``, and no child
outlives its worker (SIGTERM or SIGKILL).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pgqueue
from pgqueue import AttemptOutcome, JobStatus
from tests.apps.process_pool import build_app
from tests.cli_support import assert_one_line_error, run_cli
from tests.fixtures.workers import WorkerProcess, Workers, task_events, wait_until
from tests.test_metrics import samples, scrape

APP = "tests.apps.process_pool:app"
#: Bound on waits for a process to go (a kill grace of 1 s plus slack for a loaded machine).
GONE = 30.0


@pytest.fixture
def pool_app(db_dsn: str) -> Iterator[pgqueue.App]:
    with build_app(db_dsn) as built:
        yield built


def spawn_pool(workers: Workers, *args: str) -> WorkerProcess:
    worker = workers.spawn("--pool", "process", "--kill-grace", "1s", *args, app=APP)
    worker.wait_registered()
    return worker


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()  # state, ppid, ...


def alive(pid: int) -> bool:
    """Running (a zombie is not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def children_of(pid: int) -> set[int]:
    """Live processes whose parent is ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != "Z" and int(fields[1]) == pid:
                found.add(int(entry))
    return found


def wait_gone(pids: set[int], what: str) -> None:
    wait_until(lambda: not any(alive(p) for p in pids) or None, GONE, what)


def started_pid(dsn: str, job_id: int) -> int:
    """The pid a task recorded at its start (its child's)."""
    [event] = [e for e in task_events(dsn, "start") if e["job_id"] == job_id]
    return int(event["pid"])


def attempts(app: pgqueue.App, job_id: int) -> list[tuple[AttemptOutcome, str | None, str | None]]:
    history = app.get_job(job_id, history=True).attempt_history
    assert history is not None
    return [(a.outcome, a.error_code, a.error_message) for a in history]


@pytest.mark.slow
def test_sync_tasks_run_in_children_with_their_context_and_async_tasks_on_the_loop(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(workers, "--concurrency", "2")
    children = children_of(worker.pid)
    assert len(children) == 2  # --concurrency children, started before the worker registered
    assert worker.registration()["pool"] == "process"  # type: ignore[index]
    [registered] = pool_app.list_workers()
    assert registered.pool == "process"  # as `pgqueue workers list` and the dashboard show it

    sync_ids = [pool_app.enqueue("whoami", {}, tags=["t1"], meta={"n": n}).job_id for n in range(4)]
    loop_id = pool_app.enqueue("on_the_loop", {}).job_id
    enqueuing_id = pool_app.enqueue("enqueue_from_child", {}).job_id
    jobs = workers.wait_finished(pool_app, [*sync_ids, loop_id, enqueuing_id])

    for n, job_id in enumerate(sync_ids):
        job = jobs[job_id]
        assert job.status is JobStatus.SUCCEEDED, job
        result = job.result
        assert result["pid"] in children
        assert result["ppid"] == worker.pid
        assert (result["job_id"], result["attempt"]) == (job_id, 1)
        assert (result["tags"], result["meta"], result["should_stop"]) == (["t1"], {"n": n}, False)
        assert job.progress == {"step": "done"}  # set_progress in the child, written by the worker
    assert jobs[loop_id].result == worker.pid  # async tasks stay on the worker's loop

    # A task in a child enqueued a job (its App's own connection), which ran too.
    child_job = jobs[enqueuing_id].result
    [done] = workers.wait_finished(pool_app, [child_job]).values()
    assert done.status is JobStatus.SUCCEEDED
    assert done.tags == [f"from-{enqueuing_id}"]
    assert done.result["pid"] in children
    # before_enqueue ran where the enqueue happened (the child), and the
    # middleware around each run in the child that ran it.
    assert done.meta is not None
    assert done.meta["enqueued_in"] in children
    ran_in = {e["job_id"]: e["pid"] for e in task_events(db_dsn, "middleware")}
    assert ran_in == {job_id: jobs[job_id].result["pid"] for job_id in sync_ids} | {
        child_job: done.result["pid"]
    }

    # An exception in a child is recorded as one in a thread would be.
    failing = pool_app.enqueue("fails", {}, max_attempts=1).job_id
    workers.wait_finished(pool_app, [failing])
    [(outcome, code, message)] = attempts(pool_app, failing)
    assert (outcome, code, message) == (AttemptOutcome.FAILED, "ValueError", "bad things")
    assert children_of(worker.pid) == children  # an exception does not replace a child


@pytest.mark.slow
def test_context_transaction_in_a_child_commits_the_rows_and_the_success_together(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(workers, "--concurrency", "2")
    once = pool_app.enqueue("in_transaction", {"key": "once", "fail_first": False}).job_id
    again = pool_app.enqueue("in_transaction", {"key": "again", "fail_first": True}).job_id
    jobs = workers.wait_finished(pool_app, [once, again])

    for job_id in (once, again):
        assert jobs[job_id].status is JobStatus.SUCCEEDED
        assert jobs[job_id].result is None  # recorded by the transaction, not the return value
        assert len([e for e in task_events(db_dsn, "tx") if e["job_id"] == job_id]) == 1
    assert [a[:2] for a in attempts(pool_app, again)] == [
        (AttemptOutcome.FAILED, "ValueError"),  # its insert rolled back with it
        (AttemptOutcome.SUCCEEDED, None),
    ]
    assert {e["pid"] for e in task_events(db_dsn, "tx")} <= children_of(worker.pid)
    assert worker.logged("job succeeded in its transaction")
    assert worker.logged("lease lost") == []


@pytest.mark.slow
def test_a_sleeping_and_a_spinning_task_past_their_timeout_are_killed_and_the_worker_goes_on(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(workers, "--concurrency", "1")
    sleeping = pool_app.enqueue("sleep_past_timeout", {}).job_id
    spinning = pool_app.enqueue("spin_past_timeout", {}).job_id
    jobs = workers.wait_finished(pool_app, [sleeping, spinning])

    for job_id in (sleeping, spinning):
        assert jobs[job_id].status is JobStatus.DEAD
        message = f"task {jobs[job_id].task!r} exceeded its timeout of 1s"
        assert attempts(pool_app, job_id) == [(AttemptOutcome.TIMEOUT, "timeout", message)]
    # Their children are gone (with one slot, the second job ran only after the first's died).
    wait_gone({started_pid(db_dsn, sleeping), started_pid(db_dsn, spinning)}, "the killed children")
    after = pool_app.enqueue("whoami", {}).job_id
    [job] = workers.wait_finished(pool_app, [after]).values()
    assert job.status is JobStatus.SUCCEEDED
    assert job.result["pid"] not in {started_pid(db_dsn, sleeping), started_pid(db_dsn, spinning)}
    assert worker.alive()
    replaced = worker.logged("child process replaced")
    assert sorted(line["reason"] for line in replaced) == ["timeout", "timeout"]


@pytest.mark.slow
def test_a_child_that_dies_fails_its_attempt_worker_crashed_and_the_retry_succeeds(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(
        workers, "--concurrency", "2", "--metrics-port", "0", "--metrics-host", "127.0.0.1"
    )
    port = int(worker.wait_logged("serving metrics")["port"])
    ways = {
        "exit": "exited with exit status 7",
        "sigkill": "killed by signal 9 (SIGKILL)",
        "sigsegv": "killed by signal 11 (SIGSEGV)",
    }
    ids = {how: pool_app.enqueue("die_once", {"how": how}).job_id for how in ways}
    jobs = workers.wait_finished(pool_app, list(ids.values()))

    for how, job_id in ids.items():
        job = jobs[job_id]
        assert job.status is JobStatus.SUCCEEDED, (how, job)
        [(first, code, message), (second, _, _)] = attempts(pool_app, job_id)
        assert (first, code, second) == (
            AttemptOutcome.FAILED,
            "worker_crashed",
            AttemptOutcome.SUCCEEDED,
        )
        dead = started_pid(db_dsn, job_id)
        assert f"pid {dead}" in message, message
        assert ways[how] in message, message
        assert job.result != dead  # the retry ran in another child
        assert not alive(dead)
    crashes = worker.logged("child process crashed")
    assert len(crashes) == 3
    assert worker.alive()
    wait_until(lambda: len(children_of(worker.pid)) == 2 or None, GONE, "two children again")

    def replaced() -> dict[str, Any] | None:
        families = scrape(port)
        alive = samples(families, "pgqueue_worker_children", "pgqueue_worker_children")
        return families if alive == {(): 2.0} else None

    families = wait_until(replaced, GONE, "the metrics to show two children", [worker])
    assert samples(
        families, "pgqueue_worker_children_replaced", "pgqueue_worker_children_replaced_total"
    ) == {(("reason", "crashed"),): 3.0}
    pool = samples(families, "pgqueue_worker_pool_info", "pgqueue_worker_pool_info")
    assert pool == {(("pool", "process"),): 1.0}


@pytest.mark.slow
def test_cancel_stops_the_child_even_when_its_task_ignores_should_stop(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(workers, "--concurrency", "2", "--poll-interval", "0.2s")
    stubborn = pool_app.enqueue("hold", {"key": "stubborn", "honour_stop": False}).job_id
    polite = pool_app.enqueue("hold", {"key": "polite", "honour_stop": True}).job_id
    wait_until(
        lambda: len(task_events(db_dsn, "start")) == 2 or None,
        GONE,
        "both tasks to start",
        [worker],
    )
    assert pool_app.cancel(stubborn) is JobStatus.RUNNING
    assert pool_app.cancel(polite) is JobStatus.RUNNING
    jobs = workers.wait_finished(pool_app, [stubborn, polite])

    for job_id in (stubborn, polite):
        assert jobs[job_id].status is JobStatus.CANCELLED
        assert [a[0] for a in attempts(pool_app, job_id)] == [AttemptOutcome.CANCELLED]
    [stopped] = task_events(db_dsn, "stopped", "polite")  # should_stop() turned true in the child
    assert stopped["data"]["should_stop"] is True
    assert task_events(db_dsn, "stopped", "stubborn") == []
    wait_gone({started_pid(db_dsn, stubborn)}, "the stubborn child")
    assert alive(started_pid(db_dsn, polite))  # returned by itself: its child stays
    assert [line["reason"] for line in worker.logged("child process replaced")] == ["cancel"]


@pytest.mark.slow
def test_children_are_replaced_after_max_tasks_and_after_max_memory(
    workers: Workers, pool_app: pgqueue.App
) -> None:
    counting = spawn_pool(workers, "--concurrency", "1", "--max-tasks-per-child", "2")
    ids = [pool_app.enqueue("whoami", {}).job_id for _ in range(6)]
    jobs = workers.wait_finished(pool_app, ids)
    pids = [jobs[i].result["pid"] for i in ids]
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [2, 2, 2], pids
    assert {line["reason"] for line in counting.logged("child process replaced")} == {"max_tasks"}
    counting.send(signal.SIGTERM)
    assert counting.wait_exit() == 0

    hungry = spawn_pool(workers, "--concurrency", "1", "--max-memory-per-child", "150MB")
    small = pool_app.enqueue("grow", {"megabytes": 1}).job_id
    [first] = workers.wait_finished(pool_app, [small]).values()
    # It reached the limit and freed the memory before returning: still reached.
    big = pool_app.enqueue("grow", {"megabytes": 200, "keep": False}).job_id
    [second] = workers.wait_finished(pool_app, [big]).values()
    after = pool_app.enqueue("grow", {"megabytes": 1}).job_id
    [third] = workers.wait_finished(pool_app, [after]).values()
    # The job that crossed the limit still succeeded; its child was then replaced.
    assert [j.status for j in (first, second, third)] == [JobStatus.SUCCEEDED] * 3
    assert first.result == second.result != third.result
    [line] = hungry.logged("child process replaced")
    assert line["reason"] == "max_memory"
    assert line["pid"] == second.result


@pytest.mark.slow
def test_sigterm_stops_every_child_gracefully_and_sigkill_leaves_no_orphan(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(workers, "--concurrency", "2")
    children = children_of(worker.pid)
    running = pool_app.enqueue("hold", {"key": "shutdown", "honour_stop": True}).job_id
    wait_until(lambda: task_events(db_dsn, "start") or None, GONE, "the task to start", [worker])
    worker.send(signal.SIGTERM)
    assert worker.wait_exit() == 0
    assert pool_app.get_job(running).status is JobStatus.SUCCEEDED  # saw should_stop, returned
    assert task_events(db_dsn, "stopped", "shutdown")[0]["data"]["should_stop"] is True
    wait_gone(children, "the children after SIGTERM")

    killed = spawn_pool(workers, "--concurrency", "2")
    children = children_of(killed.pid)
    assert len(children) == 2
    pool_app.enqueue("hold", {"key": "orphan", "honour_stop": False})
    wait_until(lambda: task_events(db_dsn, "start", "orphan") or None, GONE, "the task", [killed])
    killed.send(signal.SIGKILL)
    killed.wait_exit()
    wait_gone(children, "the children after SIGKILL of their worker")


def test_bad_pool_options_are_one_line_errors(db_dsn: str) -> None:
    assert_one_line_error(
        run_cli(db_dsn, "worker", "--app", APP, "--pool", "fork"), "--pool", "'fork'"
    )
    assert_one_line_error(
        run_cli(db_dsn, "worker", "--app", APP, "--max-tasks-per-child", "3"),
        "--pool process",
    )
    assert_one_line_error(
        run_cli(
            db_dsn, "worker", "--app", APP, "--pool", "process", "--max-memory-per-child", "lots"
        ),
        "max_memory_per_child",
        "'lots'",
    )


def test_an_app_the_children_cannot_import_is_refused_before_any_lease(db_dsn: str) -> None:
    lonely = pgqueue.App(db_dsn)  # an attribute of no module

    @lonely.task
    def nothing() -> None: ...

    with pytest.raises(pgqueue.errors.InvalidOption, match="app_path"):
        lonely.run_worker(pool="process")
    lonely.close()


def test_the_app_path_is_found_among_imported_modules(pool_app: pgqueue.App) -> None:
    from pgqueue.worker.app_path import find_app_path
    from tests.apps import process_pool

    assert find_app_path(process_pool.app) == "tests.apps.process_pool:app"


def test_run_worker_from_python_finds_the_app_by_its_module(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.apps import process_pool
    from tests.apps.tasks import create_events_table
    from tests.inprocess_worker import finished, run_until

    create_events_table(db_dsn)
    monkeypatch.setenv("PGQUEUE_DSN", db_dsn)  # where the middleware records (children inherit it)

    process_pool.app.point_at(db_dsn)  # the children follow the worker's App here
    ids = [process_pool.app.enqueue("whoami", {}).job_id for _ in range(2)]
    run_until(process_pool.app, finished(process_pool.app, *ids), pool="process", concurrency=1)
    results = [process_pool.app.get_job(i).result for i in ids]
    assert results[0]["pid"] == results[1]["pid"] != os.getpid()
    assert results[0]["ppid"] == os.getpid()
    process_pool.app.close()


@pytest.mark.slow
def test_a_child_still_running_after_the_shutdown_timeout_is_stopped_and_its_job_handed_back(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(workers, "--concurrency", "1", "--shutdown-timeout", "1s")
    children = children_of(worker.pid)
    job_id = pool_app.enqueue("hold", {"key": "late", "honour_stop": False}).job_id
    wait_until(lambda: task_events(db_dsn, "start") or None, GONE, "the task to start", [worker])
    worker.send(signal.SIGTERM)
    assert worker.wait_exit() == 0
    wait_gone(children, "the children after the shutdown")
    job = pool_app.get_job(job_id)
    assert job.status is JobStatus.QUEUED  # handed back for another worker
    assert worker.logged("handing unfinished jobs back")


FRAGILE_APP = """
import os
import pgqueue

app = pgqueue.App()


@app.task(max_attempts=3)
def crash() -> None:
    os._exit(3)
"""


@pytest.mark.slow
def test_a_worker_that_cannot_start_replacement_children_stops_and_hands_its_jobs_back(
    workers: Workers, pool_app: pgqueue.App, tmp_path: Path
) -> None:
    module = tmp_path / "fragile_app.py"
    module.write_text(FRAGILE_APP)
    worker = workers.spawn("--pool", "process", "--concurrency", "1", app=f"{module}:app")
    worker.wait_registered()
    module.unlink()  # the next child cannot import the App any more
    job_id = pool_app.enqueue("crash", {}).job_id
    assert worker.wait_exit() == 1
    [stopping] = worker.logged("stopping the worker")
    assert stopping["loop"] == "process pool"
    assert "no such file" in stopping["error"]
    assert len(worker.logged("could not start a replacement child process")) == 4
    job = pool_app.get_job(job_id, history=True)
    assert job.status is JobStatus.QUEUED  # its crash recorded, the job waits for another worker
    history = attempts(pool_app, job_id)
    assert history[0][1] == "worker_crashed"
    assert [a[1] for a in history[1:]] in ([], [None])  # a retry leased and handed back
    assert children_of(worker.pid) == set()


@pytest.mark.slow
def test_a_durable_task_in_a_child_stores_steps_sleeps_and_waits_for_events(
    workers: Workers, pool_app: pgqueue.App, db_dsn: str
) -> None:
    worker = spawn_pool(workers, "--concurrency", "2")
    job_id = pool_app.enqueue("durable_in_child", {"key": "k1"}).job_id
    # attempt 1 stores the step and fails; the retry skips the step, sleeps 1 s,
    # then waits for the event with no worker slot.
    wait_until(
        lambda: pool_app.get_job(job_id).status is JobStatus.WAITING or None,
        60,
        "the job to wait for its event",
    )
    pool_app.send_event("paid:k1", {"amount": 21})
    [job] = workers.wait_finished(pool_app, [job_id]).values()
    assert job.status is JobStatus.SUCCEEDED, job
    assert job.result["total"] == 42
    assert job.result["charged_in"] in children_of(worker.pid) | {job.result["pid"]}
    charges = [e for e in task_events(db_dsn, "charge") if e["job_id"] == job_id]
    assert len(charges) == 1  # the stored step never ran again
    outcomes = [a[0] for a in attempts(pool_app, job_id)]
    assert outcomes[0] is AttemptOutcome.FAILED
    assert AttemptOutcome.SLEPT in outcomes
    steps = {s.name: s for s in pool_app.get_job(job_id).steps}
    assert steps["charge"].result == job.result["charged_in"]
    assert steps["total"].result == 42
