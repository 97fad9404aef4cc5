"""Chaos over workflows: real workers run diamonds, chains, fan-outs/fan-ins
of a few hundred steps with their callbacks, and plain ``depends_on`` jobs,
while the test SIGKILLs (now and then SIGTERMs) workers at random moments,
``pg_terminate_backend``s their connections and starts replacements.

Steps are :func:`tests.apps.workflow_chaos.wf_step`: each run records its
start (database clock) and the dependency statuses it saw; a success is
recorded inside ``context.transaction()``, so it commits with the ack and
counts successful completions exactly (runs are at least once, successes
exactly once). Some steps fail permanently, some outsleep their lease.

While the chaos goes on, a single-statement snapshot is checked every half
second (a release commits with the end that causes it, so every snapshot
must be consistent): no job ``waiting`` whose dependencies all ended, none
released while a dependency is unfinished (or failed, without
``allow_failed``), each waiting job's pending counter equal to its
unfinished dependencies. Afterwards, from the database:

- nothing is lost: every planned step is a job with the planned edges, and
  it ended with the status the graph implies (``dead`` for the failing
  steps, ``cancelled`` below them unless ``allow_failed``, else
  ``succeeded``); nothing is left ``waiting``, every pending counter is 0;
- every run started after each of its dependencies ended ``succeeded``
  (ended at all, with ``allow_failed``), also by the statuses the step saw
  and by the attempt records; a cancelled step never ran;
- every succeeded step (each callback in particular) completed successfully
  exactly once, in the attempt its job row names; others never did.

The seed comes from ``PGQUEUE_CHAOS_SEED`` and is printed.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue
from tests.apps.workflow_chaos import TASK_APPLICATION_NAME, build_app, create_tables
from tests.fixtures.workers import WorkerProcess, Workers

SEED = int(os.environ.get("PGQUEUE_CHAOS_SEED", "20240917"))
WORKERS = 3
CHAOS_SECONDS = 25.0
DRAIN_TIMEOUT = 45.0
KILL_EVERY = (2.0, 4.0)  # seconds between worker kills
SIGTERM_SHARE = 0.15
TERMINATE_EVERY = (0.6, 1.4)  # seconds between backend terminations
SNAPSHOT_EVERY = 0.5  # seconds between live consistency checks
LEASE_STAMP_SLACK = timedelta(milliseconds=250)  # see check_attempts_after_dependencies
FINAL = ("succeeded", "dead", "cancelled")

WORKER_APP = "tests.apps.workflow_chaos:app"
WORKER_ARGS = (
    "--concurrency", "8",
    "--poll-interval", "0.5s",
    "--reap-interval", "0.5s",
    "--shutdown-timeout", "1s",
    "--no-scheduler",
    "--log-level", "warning",
)  # fmt: skip
TEST_APPLICATION_NAME = "wf-chaos-test"  # never terminated by the chaos
VICTIM_APPLICATIONS = ("pgqueue", TASK_APPLICATION_NAME)

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(150)]


# --- the plan: what is enqueued and what each step must end as ----------------


@dataclass(frozen=True, slots=True)
class StepPlan:
    key: str  # "<workflow>/<step>": the payload's key
    after: tuple[str, ...]  # keys of its dependencies
    allow_failed: bool
    fail: bool
    callback: bool
    in_workflow: bool = True

    def dependency_name(self, dep_key: str, plan: Plan) -> str:
        """How ``context.dependency_statuses()`` names a dependency: its step
        name in a workflow, its job id as text for a plain ``depends_on``."""
        return dep_key.split("/", 1)[1] if self.in_workflow else str(plan.ids[dep_key])


@dataclass
class Plan:
    steps: dict[str, StepPlan] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)  # key -> job id
    expected: dict[str, str] = field(default_factory=dict)  # key -> final status

    def settle(self, step: StepPlan) -> None:
        """The final status the graph implies (steps come in topological order)."""
        ends = [self.expected[k] for k in step.after]
        if not step.allow_failed and any(e in ("dead", "cancelled") for e in ends):
            self.expected[step.key] = "cancelled"
        else:
            self.expected[step.key] = "dead" if step.fail else "succeeded"

    def by_id(self) -> dict[int, StepPlan]:
        return {self.ids[k]: s for k, s in self.steps.items()}


class Graph:
    """A workflow being built, recorded in the plan as it is enqueued."""

    def __init__(self, app: pgqueue.App, plan: Plan, name: str) -> None:
        self.wf = app.workflow(name)
        self.plan = plan
        self.name = name
        self.added: dict[str, tuple[pgqueue.Step, StepPlan]] = {}

    def add(
        self,
        name: str,
        after: tuple[str, ...] = (),
        *,
        sleep: float = 0.0,
        fail: bool = False,
        allow_failed: bool = False,
        callback: bool = False,
    ) -> str:
        key = f"{self.name}/{name}"
        step = self.wf.add(
            "wf_step",
            {"key": key, "sleep": round(sleep, 3), "fail": fail},
            after=[self.added[a][0] for a in after],
            name=name,
            allow_failed=allow_failed,
        )
        after_keys = tuple(f"{self.name}/{a}" for a in after)
        self.added[name] = (step, StepPlan(key, after_keys, allow_failed, fail, callback))
        return name

    def enqueue(self) -> None:
        run = self.wf.enqueue()
        for name, (_, step) in self.added.items():
            self.plan.steps[step.key] = step
            self.plan.ids[step.key] = run.jobs[name]
            self.plan.settle(step)


def leaf_sleep(rng: random.Random) -> float:
    """Mostly short; one in 25 outsleeps the 2 s lease (the heartbeat keeps it)."""
    return rng.uniform(2.3, 3.0) if rng.random() < 0.04 else rng.uniform(0.05, 0.6)


def fan(
    app: pgqueue.App, plan: Plan, rng: random.Random, name: str, leaves: int, failing: int = 0
) -> None:
    """root -> ``leaves`` leaves -> callbacks. Without failures: a success
    callback and a step after it. With ``failing`` leaves that fail for good:
    an allow_failed callback (runs) with a step after it (runs), and a success
    callback (cancelled) with a step after it (cancelled: propagation)."""
    g = Graph(app, plan, name)
    root = g.add("root", sleep=0.2)
    bad = set(rng.sample(range(leaves), failing))
    names = tuple(
        g.add(f"leaf-{i}", (root,), sleep=leaf_sleep(rng), fail=i in bad) for i in range(leaves)
    )
    if failing:
        done = g.add("all-done", names, allow_failed=True, callback=True, sleep=0.3)
        g.add("after-all-done", (done,))
    ok = g.add("on-success", names, callback=True, sleep=0.3)
    g.add("after-success", (ok,))
    g.enqueue()


def diamond(app: pgqueue.App, plan: Plan, rng: random.Random, index: int) -> None:
    """a -> (b, c) -> d -> callback (allow_failed). Variant 1: c fails, so d is
    cancelled and the callback still runs; variant 2: b outsleeps its lease."""
    variant = index % 3
    g = Graph(app, plan, f"diamond-{index}")
    a = g.add("a", sleep=rng.uniform(0.05, 0.4))
    b = g.add("b", (a,), sleep=2.6 if variant == 2 else rng.uniform(0.05, 0.4))
    c = g.add("c", (a,), sleep=rng.uniform(0.05, 0.4), fail=variant == 1)
    d = g.add("d", (b, c), sleep=rng.uniform(0.05, 0.4))
    g.add("callback", (d,), allow_failed=True, callback=True)
    g.enqueue()


def chain(app: pgqueue.App, plan: Plan, name: str, length: int, failing_at: int) -> None:
    """s0 -> s1 -> ... with s<failing_at> failing: everything below it is
    cancelled, step by step; a final allow_failed step runs anyway."""
    g = Graph(app, plan, name)
    previous: tuple[str, ...] = ()
    for i in range(length):
        previous = (g.add(f"s{i}", previous, sleep=0.1, fail=i == failing_at),)
    g.add("cleanup", previous, allow_failed=True, callback=True)
    g.enqueue()


def plain_pair(app: pgqueue.App, plan: Plan, index: int) -> None:
    """A plain job and one that ``depends_on`` it (no workflow)."""
    first_key, second_key = f"plain-{index}/first", f"plain-{index}/second"
    first = app.enqueue("wf_step", {"key": first_key, "sleep": 0.5, "fail": False}).job_id
    second = app.enqueue(
        "wf_step", {"key": second_key, "sleep": 0.1, "fail": False}, depends_on=[first]
    ).job_id
    for key, job_id, after in ((first_key, first, ()), (second_key, second, (first_key,))):
        step = StepPlan(key, after, False, False, False, in_workflow=False)
        plan.steps[key] = step
        plan.ids[key] = job_id
        plan.settle(step)


def enqueue_schedule(app: pgqueue.App, plan: Plan, rng: random.Random) -> list[tuple[float, Any]]:
    """(seconds after the start, what to enqueue then)."""
    schedule: list[tuple[float, Any]] = [
        (0.0, lambda: fan(app, plan, rng, "fan-a", 300)),
        (0.5, lambda: chain(app, plan, "chain", 8, 3)),
        (3.0, lambda: plain_pair(app, plan, 0)),
        (6.0, lambda: fan(app, plan, rng, "fan-b", 120, failing=4)),
        (11.0, lambda: fan(app, plan, rng, "fan-c", 200)),
        (16.0, lambda: plain_pair(app, plan, 1)),
    ]
    for i in range(12):
        schedule.append((1.0 + i * 1.5, lambda i=i: diamond(app, plan, rng, i)))
    return sorted(schedule, key=lambda item: item[0])


# --- the chaos ---------------------------------------------------------------


@dataclass
class Chaos:
    workers: Workers
    dsn: str
    rng: random.Random
    serving: list[WorkerProcess] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    kills: int = 0
    sigterms: int = 0
    terminated: int = 0
    started_at: float = field(default_factory=time.monotonic)

    def log(self, message: str) -> None:
        self.events.append(f"{time.monotonic() - self.started_at:7.2f}s {message}")

    def keep_workers(self) -> None:
        for worker in [w for w in self.serving if not w.alive()]:
            self.serving.remove(worker)
            self.log(f"worker {worker.pid} exited {worker.proc.returncode}; replacing it")
        while len(self.serving) < WORKERS:
            self.serving.append(self.workers.spawn(*WORKER_ARGS, app=WORKER_APP))

    def kill_one(self) -> None:
        victim = self.rng.choice(self.serving)
        self.serving.remove(victim)  # a SIGTERMed worker winds down on its own
        if self.rng.random() < SIGTERM_SHARE:
            victim.send(signal.SIGTERM)
            self.sigterms += 1
            self.log(f"SIGTERM worker {victim.pid}")
        else:
            victim.send(signal.SIGKILL)
            self.kills += 1
            self.log(f"SIGKILL worker {victim.pid}")
        self.keep_workers()

    def terminate_backends(self, conn: psycopg.Connection[Any]) -> None:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = ANY(%s) AND pid <> pg_backend_pid() ORDER BY pid",
                (list(VICTIM_APPLICATIONS),),
            )
        ]
        chosen = self.rng.sample(pids, min(len(pids), self.rng.randint(1, 3)))
        for pid in chosen:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        self.terminated += len(chosen)
        self.log(f"terminated {len(chosen)} backends")


# --- the checks --------------------------------------------------------------

SNAPSHOT = """
SELECT j.id, j.status::text, w.pending,
       count(*) FILTER (WHERE p.status NOT IN ('succeeded', 'dead', 'cancelled')),
       count(*) FILTER (WHERE p.status IN ('dead', 'cancelled'))
FROM pgqueue.job_waits w
JOIN pgqueue.jobs j ON j.id = w.job_id
JOIN pgqueue.job_dependencies d ON d.job_id = w.job_id
JOIN pgqueue.jobs p ON p.id = d.depends_on
GROUP BY j.id, j.status, w.pending
"""


def check_snapshot(
    conn: psycopg.Connection[Any], by_id: dict[int, StepPlan], seen: Counter[str]
) -> list[str]:
    """One statement, one snapshot: releases commit with the ends causing
    them, so no snapshot may show a release missing or premature."""
    violations = []
    for job_id, status, pending, unfinished, failed in conn.execute(SNAPSHOT):
        step = by_id.get(job_id)
        if step is None:
            violations.append(f"job {job_id} ({status}): waits for jobs but is not in the plan")
            continue
        seen[status] += 1
        blocked = failed > 0 and not step.allow_failed
        if pending != unfinished:
            violations.append(
                f"{step.key} ({status}): pending counter {pending}, "
                f"{unfinished} dependencies unfinished"
            )
        if status == "waiting" and unfinished == 0:
            violations.append(f"{step.key}: waiting although every dependency ended")
        elif status == "waiting" and blocked:
            violations.append(f"{step.key}: waiting although a dependency failed")
        elif status not in ("waiting", "cancelled") and (unfinished > 0 or blocked):
            violations.append(
                f"{step.key}: {status} with {unfinished} unfinished and {failed} failed "
                f"dependencies (allow_failed={step.allow_failed})"
            )
        elif status == "cancelled" and not blocked:
            violations.append(f"{step.key}: cancelled though no dependency failed")
    return violations


@dataclass(frozen=True, slots=True)
class JobEnd:
    id: int
    key: str
    status: str
    attempt_id: int | None
    attempt_started_at: datetime | None
    finished_at: datetime | None


def load(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs = {
            row[0]: JobEnd(*row)
            for row in conn.execute(
                "SELECT id, payload->>'key', status::text, attempt_id, attempt_started_at,"
                " finished_at FROM pgqueue.jobs"
            )
        }
        edges = conn.execute("SELECT job_id, depends_on FROM pgqueue.job_dependencies").fetchall()
        waits = dict(conn.execute("SELECT job_id, pending FROM pgqueue.job_waits").fetchall())
        attempts = conn.execute(
            "SELECT job_id, id, started_at, outcome::text FROM pgqueue.job_attempts"
        ).fetchall()
        runs = conn.execute("SELECT job_id, attempt_id, started_at, saw FROM public.wf_runs")
        runs_list = runs.fetchall()
        successes = conn.execute("SELECT job_id, attempt_id FROM public.wf_success").fetchall()
    return {
        "jobs": jobs,
        "edges": edges,
        "waits": waits,
        "attempts": attempts,
        "runs": runs_list,
        "successes": successes,
    }


def check_final(plan: Plan, state: dict[str, Any]) -> tuple[list[str], Counter[str]]:
    violations: list[str] = []
    stats: Counter[str] = Counter()
    jobs: dict[int, JobEnd] = state["jobs"]
    by_id = plan.by_id()
    key_of = {job_id: step.key for job_id, step in by_id.items()}

    # Nothing lost, nothing extra; the stored graph is the planned one.
    if extra := sorted(set(jobs) - set(by_id)):
        violations.append(f"jobs outside the plan: {extra[:10]}")
    stored_after: dict[int, set[int]] = defaultdict(set)
    for job_id, depends_on in state["edges"]:
        stored_after[job_id].add(depends_on)
    for key, step in plan.steps.items():
        job_id = plan.ids[key]
        job = jobs.get(job_id)
        if job is None:
            violations.append(f"{key}: job {job_id} is missing")
            continue
        stats[f"status:{job.status}"] += 1
        if job.key != key:
            violations.append(f"{key}: job {job_id} carries the payload of {job.key}")
        planned_after = {plan.ids[k] for k in step.after}
        if stored_after.get(job_id, set()) != planned_after:
            violations.append(
                f"{key}: stored dependencies {sorted(stored_after.get(job_id, ()))}, "
                f"planned {sorted(planned_after)}"
            )
        if job.status != plan.expected[key]:
            violations.append(f"{key}: ended {job.status}, expected {plan.expected[key]}")
        if job.status not in FINAL:
            violations.append(f"{key}: left {job.status}")
        if step.after and state["waits"].get(job_id) != 0:
            violations.append(f"{key}: pending counter {state['waits'].get(job_id)} at the end")

    # Every run started after each dependency ended (succeeded, unless allow_failed).
    runs_by_job: Counter[int] = Counter()
    for job_id, attempt_id, started_at, saw in state["runs"]:
        step = by_id.get(job_id)
        if step is None:
            violations.append(f"a run of job {job_id}, which is not in the plan")
            continue
        runs_by_job[job_id] += 1
        stats["runs"] += 1
        if plan.expected[step.key] == "cancelled":
            violations.append(f"{step.key}: ran (attempt {attempt_id}) but was to be cancelled")
        for dep_key in step.after:
            dep = jobs[plan.ids[dep_key]]
            if dep.finished_at is None or dep.finished_at > started_at:
                violations.append(
                    f"{step.key}: run of attempt {attempt_id} started {started_at.isoformat()} "
                    f"before {dep_key} ended ({dep.status}, {dep.finished_at})"
                )
            if not step.allow_failed and dep.status != "succeeded":
                violations.append(f"{step.key}: ran although {dep_key} ended {dep.status}")
        saw_names = {step.dependency_name(k, plan) for k in step.after}
        if set(saw) != saw_names:
            violations.append(f"{step.key}: saw dependencies {sorted(saw)}, has {saw_names}")
        for name, status in saw.items():
            if status not in FINAL or (not step.allow_failed and status != "succeeded"):
                violations.append(f"{step.key}: ran while dependency {name} was {status}")
    stats["reruns"] = sum(n - 1 for n in runs_by_job.values() if n > 1)

    violations += check_attempts_after_dependencies(plan, jobs, state["attempts"])

    # Exactly one successful completion per succeeded job, in its final attempt.
    successes: dict[int, list[int]] = defaultdict(list)
    for job_id, attempt_id in state["successes"]:
        successes[job_id].append(attempt_id)
    for job_id, job in jobs.items():
        done = successes.get(job_id, [])
        key = key_of.get(job_id, str(job_id))
        if job.status == "succeeded":
            if len(done) != 1:
                violations.append(f"{key}: succeeded with {len(done)} successful completions")
            elif done[0] != job.attempt_id:
                violations.append(
                    f"{key}: completed in attempt {done[0]}, its row names {job.attempt_id}"
                )
            if runs_by_job[job_id] == 0:
                violations.append(f"{key}: succeeded without a recorded run")
        elif done:
            violations.append(f"{key}: {job.status} but completed successfully {len(done)} times")
    for key, step in plan.steps.items():
        if step.callback and plan.expected[key] == "succeeded":
            stats["callbacks"] += 1
            stats["callback_runs"] += runs_by_job[plan.ids[key]]
    return violations, stats


def check_attempts_after_dependencies(
    plan: Plan, jobs: dict[int, JobEnd], attempts: list[tuple[int, int, datetime, str]]
) -> list[str]:
    """No lease of a step began before a dependency ended. lease_jobs stamps
    an attempt's start when the function starts, a moment before its scan
    sees what committed meanwhile: LEASE_STAMP_SLACK allows for that."""
    violations = []
    starts: dict[int, list[tuple[int, datetime]]] = defaultdict(list)
    for job_id, attempt_id, started_at, _ in attempts:
        starts[job_id].append((attempt_id, started_at))
    for job in jobs.values():
        if job.attempt_id is not None and job.attempt_started_at is not None:
            starts[job.id].append((job.attempt_id, job.attempt_started_at))
    for key, step in plan.steps.items():
        for attempt_id, started_at in starts.get(plan.ids[key], []):
            for dep_key in step.after:
                dep = jobs[plan.ids[dep_key]]
                if dep.finished_at is None or started_at < dep.finished_at - LEASE_STAMP_SLACK:
                    violations.append(
                        f"{key}: attempt {attempt_id} leased at {started_at.isoformat()}, "
                        f"before {dep_key} ended ({dep.finished_at})"
                    )
    return violations


def progress(conn: psycopg.Connection[Any], ids: list[int]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgqueue.jobs WHERE id = ANY(%s)"
        " AND status IN ('succeeded', 'dead', 'cancelled')",
        (ids,),
    ).fetchone()
    assert row is not None
    done: int = row[0]
    return done


# --- the test ----------------------------------------------------------------


def test_workflows_release_exactly_once_under_chaos(db_dsn: str, tmp_path: Path) -> None:
    print(f"workflow chaos seed: {SEED} (set PGQUEUE_CHAOS_SEED to change it)")
    rng = random.Random(SEED)
    create_tables(db_dsn)
    test_dsn = psycopg.conninfo.make_conninfo(db_dsn, application_name=TEST_APPLICATION_NAME)
    workers = Workers(db_dsn, tmp_path)
    chaos = Chaos(workers, test_dsn, rng)
    plan = Plan()
    live_violations: list[str] = []
    seen: Counter[str] = Counter()
    snapshots = 0
    producer = build_app(test_dsn)
    try:
        with psycopg.connect(test_dsn, autocommit=True) as conn:
            chaos.keep_workers()
            start = time.monotonic()
            pending = enqueue_schedule(producer, plan, rng)
            next_kill = start + rng.uniform(*KILL_EVERY)
            next_terminate = start + rng.uniform(*TERMINATE_EVERY)
            next_snapshot = start
            while (now := time.monotonic()) < start + CHAOS_SECONDS or pending:
                while pending and now >= start + pending[0][0]:
                    pending.pop(0)[1]()
                if now >= next_kill:
                    chaos.kill_one()
                    next_kill = now + rng.uniform(*KILL_EVERY)
                if now >= next_terminate:
                    chaos.terminate_backends(conn)
                    next_terminate = now + rng.uniform(*TERMINATE_EVERY)
                if now >= next_snapshot:
                    live_violations += check_snapshot(conn, plan.by_id(), seen)
                    snapshots += 1
                    next_snapshot = now + SNAPSHOT_EVERY
                chaos.keep_workers()
                time.sleep(0.02)
            chaos.log("faults stop; draining")

            ids = list(plan.ids.values())
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while (done := progress(conn, ids)) < len(ids):
                if time.monotonic() > deadline:
                    left = conn.execute(
                        "SELECT id, payload->>'key', status::text, attempts FROM pgqueue.jobs"
                        " WHERE id = ANY(%s) AND status NOT IN ('succeeded', 'dead', 'cancelled')"
                        " ORDER BY id LIMIT 20",
                        (ids,),
                    ).fetchall()
                    pytest.fail(
                        f"seed {SEED}: {len(ids) - done} of {len(ids)} jobs unfinished "
                        f"{DRAIN_TIMEOUT}s after the faults stopped, e.g. {left}\n"
                        + "\n".join(chaos.events[-20:])
                        + "\n"
                        + "\n".join(w.describe() for w in chaos.serving)
                    )
                live_violations += check_snapshot(conn, plan.by_id(), seen)
                snapshots += 1
                chaos.keep_workers()
                time.sleep(0.2)
            elapsed = time.monotonic() - start
            live_violations += check_snapshot(conn, plan.by_id(), seen)
    finally:
        producer.close()
        workers.cleanup()

    violations, stats = check_final(plan, load(test_dsn))
    violations = live_violations + violations
    print(
        f"workflow chaos seed {SEED}: {len(plan.ids)} jobs in {elapsed:.1f}s; "
        f"{len(workers.started)} worker processes, {chaos.kills} SIGKILLs, {chaos.sigterms} "
        f"SIGTERMs, {chaos.terminated} backends terminated; {snapshots} snapshots "
        f"(dependent jobs seen: {dict(seen)}); {dict(sorted(stats.items()))}"
    )
    print("\n".join(chaos.events))
    assert chaos.kills > 0
    assert chaos.terminated > 0
    assert not violations, f"seed {SEED}: {len(violations)} violations\n" + "\n".join(
        violations[:30]
    )
