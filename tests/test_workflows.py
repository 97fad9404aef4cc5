"""Workflows and depends_on: waiting jobs released in the database when their
dependencies end, failure policies, result passing, run by a real worker."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue import JobContext, JobStatus
from tests.cli_support import invoke
from tests.inprocess_worker import finished, quiet_structlog, run_until

pytestmark = pytest.mark.usefixtures("quiet_structlog")
__all__ = ["quiet_structlog"]


def checkout_app(app: pgqueue.App, ran: list[str], fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    def step(name: str) -> Any:
        @app.task(name=name, max_attempts=1, pass_context=True)
        def run(context: JobContext, order_id: int = 0) -> dict[str, Any]:
            ran.append(name)
            if name in fail:
                raise RuntimeError(f"{name} failed")
            return {"step": name, "seen": sorted(context.dependency_results())}

        return run

    for name in ("fetch_order", "charge_card", "reserve_stock", "ship_order", "notify_ops"):
        step(name)


def build_checkout(app: pgqueue.App) -> pgqueue.Workflow:
    wf = app.workflow("checkout-42")
    fetch = wf.add("fetch_order", {"order_id": 42})
    charge = wf.add("charge_card", {"order_id": 42}, after=fetch)
    stock = wf.add("reserve_stock", {"order_id": 42}, after=fetch, name="stock")
    ship = wf.add("ship_order", {"order_id": 42}, after=[charge, stock])
    wf.add("notify_ops", {}, after=[ship], allow_failed=True)
    return wf


def test_a_diamond_runs_in_dependency_order_and_passes_results(app: pgqueue.App) -> None:
    ran: list[str] = []
    checkout_app(app, ran)
    run = build_checkout(app).enqueue()

    assert set(run.jobs) == {"fetch_order", "charge_card", "stock", "ship_order", "notify_ops"}
    before = app.get_workflow(run.workflow_id)
    assert before.status == "running"
    assert before.steps["fetch_order"].status is JobStatus.QUEUED
    assert {n: j.status for n, j in before.steps.items() if n != "fetch_order"} == dict.fromkeys(
        ["charge_card", "stock", "ship_order", "notify_ops"], JobStatus.WAITING
    )
    assert before.after == {
        "fetch_order": [],
        "charge_card": ["fetch_order"],
        "stock": ["fetch_order"],
        "ship_order": ["charge_card", "stock"],
        "notify_ops": ["ship_order"],
    }

    run_until(app, finished(app, *run.jobs.values()), concurrency=4)

    after = app.get_workflow(run.workflow_id)
    assert after.status == "succeeded"
    assert ran.index("fetch_order") < min(ran.index("charge_card"), ran.index("reserve_stock"))
    assert ran.index("ship_order") > max(ran.index("charge_card"), ran.index("reserve_stock"))
    assert ran[-1] == "notify_ops"
    assert after.steps["ship_order"].result == {
        "step": "ship_order",
        "seen": ["charge_card", "stock"],
    }
    assert [w.workflow_id for w in app.list_workflows()] == [run.workflow_id]
    assert app.list_workflows(status="running") == []


def test_a_dead_dependency_cancels_the_graph_below_and_the_callback_still_runs(
    app: pgqueue.App,
) -> None:
    ran: list[str] = []
    checkout_app(app, ran, fail={"reserve_stock"})
    run = build_checkout(app).enqueue()

    run_until(app, finished(app, *run.jobs.values()), concurrency=4)

    info = app.get_workflow(run.workflow_id)
    statuses = {n: j.status for n, j in info.steps.items()}
    assert statuses == {
        "fetch_order": JobStatus.SUCCEEDED,
        "charge_card": JobStatus.SUCCEEDED,
        "stock": JobStatus.DEAD,
        "ship_order": JobStatus.CANCELLED,
        "notify_ops": JobStatus.SUCCEEDED,  # allow_failed: runs whatever ship's fate
    }
    assert info.steps["ship_order"].last_error == f"dependency {run.jobs['stock']} ended dead"
    assert info.status == "failed"
    assert "ship_order" not in ran


def test_depends_on_waits_for_plain_jobs_and_resolves_ended_ones(app: pgqueue.App) -> None:
    seen: dict[str, Any] = {}

    @app.task(name="first")
    def first() -> int:
        return 7

    @app.task(name="second", pass_context=True)
    def second(context: JobContext) -> None:
        seen["results"] = context.dependency_results()
        seen["statuses"] = context.dependency_statuses()
        seen["workflow"] = context.workflow_id

    parent = app.enqueue("first").job_id
    child = app.enqueue("second", depends_on=[parent]).job_id
    assert app.get_job(child).status is JobStatus.WAITING
    assert "waiting for 1 of its 1 dependencies" in app.explain(child)

    run_until(app, finished(app, parent, child))
    assert seen == {
        "results": {str(parent): 7},
        "statuses": {str(parent): JobStatus.SUCCEEDED},
        "workflow": None,
    }
    # A dependency that already succeeded: queued at once.
    late = app.enqueue("second", depends_on=[parent]).job_id
    assert app.get_job(late).status is JobStatus.QUEUED


def test_an_unknown_dependency_writes_nothing(app: pgqueue.App, db_dsn: str) -> None:
    with pytest.raises(pgqueue.JobNotFound):
        app.enqueue("t", depends_on=[424242])
    with pytest.raises(pgqueue.JobNotFound):
        app.enqueue_many([pgqueue.JobSpec("t"), pgqueue.JobSpec("u", depends_on=[424242])])
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone() == (0,)


def test_a_cancelled_or_dead_dependency_cancels_unless_allow_failed(app: pgqueue.App) -> None:
    parent = app.enqueue("t").job_id
    strict = app.enqueue("t", depends_on=[parent]).job_id
    lenient = app.enqueue("t", depends_on=[parent], allow_failed=True).job_id
    app.cancel(parent)

    assert app.get_job(strict).status is JobStatus.CANCELLED
    assert app.get_job(strict).last_error == f"dependency {parent} ended cancelled"
    assert app.get_job(lenient).status is JobStatus.QUEUED


def test_workflow_building_refuses_bad_graphs(app: pgqueue.App) -> None:
    wf = app.workflow("w")
    first = wf.add("t")
    with pytest.raises(pgqueue.InvalidInput, match="already has a step named 't'"):
        wf.add("t")
    other = app.workflow("other").add("t")
    with pytest.raises(pgqueue.InvalidInput, match="after= takes steps added earlier"):
        wf.add("u", after=other)
    with pytest.raises(pgqueue.InvalidInput, match="dedup_key"):
        wf.add("v", dedup_key="k")
    wf.add("t", after=first, name="again")
    run = wf.enqueue()
    assert set(run.jobs) == {"t", "again"}


def test_cancel_workflow_cancels_its_live_steps(app: pgqueue.App) -> None:
    run = build_checkout(app).enqueue()
    assert app.cancel_workflow(run.workflow_id) == 5
    info = app.get_workflow(run.workflow_id)
    assert {j.status for j in info.steps.values()} == {JobStatus.CANCELLED}
    assert info.status == "failed"
    with pytest.raises(pgqueue.WorkflowNotFound):
        app.get_workflow(999)


def test_a_ten_thousand_step_fan_out_and_fan_in_releases_its_callback_once(
    app: pgqueue.App, db_dsn: str
) -> None:
    wf = app.workflow("fan")
    root = wf.add("t", name="root")
    leaves = [wf.add("leaf", {"n": n}, after=root, name=f"leaf-{n}") for n in range(10_000)]
    wf.add("callback", after=leaves)
    run = wf.enqueue()  # one statement
    callback = run.jobs["callback"]

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (leased,) = conn.execute(
            "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(NULL, 'w', 1)"
        ).fetchall()
        conn.execute("SELECT pgqueue.ack(%s, %s)", leased)
        for _ in range(20):
            batch = conn.execute(
                "SELECT job_id, attempt_id FROM pgqueue.lease_jobs(NULL, 'w', 500)"
            ).fetchall()
            assert callback not in {r[0] for r in batch}
            conn.execute(
                "SELECT * FROM pgqueue.ack_jobs(%s, %s, NULL)",
                ([r[0] for r in batch], [r[1] for r in batch]),
            )
        ready = conn.execute(
            "SELECT status FROM pgqueue.jobs WHERE id = %s", (callback,)
        ).fetchone()
        pending = conn.execute(
            "SELECT pending FROM pgqueue.job_waits WHERE job_id = %s", (callback,)
        ).fetchone()
    assert ready == ("queued",)
    assert pending == (0,)


def test_sql_enqueue_takes_depends_on(app: pgqueue.App, db_dsn: str) -> None:
    parent = app.enqueue("t").job_id
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pgqueue.enqueue('child', depends_on => ARRAY[%s]::bigint[])", (parent,)
        ).fetchone()
    assert row is not None
    assert app.get_job(row[0]).status is JobStatus.WAITING


def test_cli_workflow_commands_and_depends_on(app: pgqueue.App, db_dsn: str) -> None:
    run = build_checkout(app).enqueue()
    listed = invoke(db_dsn, "workflow", "list", "--json")
    assert listed.exit_code == 0, listed.stderr
    assert [w["workflow_id"] for w in json.loads(listed.stdout)] == [run.workflow_id]
    shown = invoke(db_dsn, "workflow", "show", str(run.workflow_id))
    assert shown.exit_code == 0, shown.stderr
    assert "ship_order" in shown.stdout
    assert "waiting" in shown.stdout
    enq = invoke(db_dsn, "enqueue", "later", "--depends-on", str(run.jobs["fetch_order"]), "--json")
    assert enq.exit_code == 0, enq.stderr
    assert app.get_job(json.loads(enq.stdout)["job_id"]).status is JobStatus.WAITING
    cancelled = invoke(db_dsn, "workflow", "cancel", str(run.workflow_id))
    assert cancelled.exit_code == 0, cancelled.stderr
    assert app.get_workflow(run.workflow_id).status == "failed"


def test_cli_workflow_show_takes_a_unique_name_and_lists_namesakes(
    app: pgqueue.App, db_dsn: str
) -> None:
    unique = build_checkout(app).enqueue()  # named "checkout-42"
    twins = []
    for _ in range(2):
        wf = app.workflow("nightly report")
        wf.add("extract")
        twins.append(wf.enqueue())
    app.cancel_workflow(twins[0].workflow_id)

    by_name = invoke(db_dsn, "workflow", "show", "checkout-42")
    by_id = invoke(db_dsn, "workflow", "show", str(unique.workflow_id))
    assert by_name.exit_code == 0, by_name.stderr
    assert by_name.stdout == by_id.stdout
    assert f"workflow {unique.workflow_id} 'checkout-42'" in by_name.stdout
    as_json = invoke(db_dsn, "workflow", "show", "checkout-42", "--json")
    assert json.loads(as_json.stdout)["workflow_id"] == unique.workflow_id

    shared = invoke(db_dsn, "workflow", "show", "nightly report")
    assert shared.exit_code == 1
    assert shared.stdout == ""
    first_line, *listing = shared.stderr.splitlines()
    assert first_line == (
        "error: 2 workflows are named 'nightly report': show one by its id, "
        f"e.g. pgqueue workflow show {twins[1].workflow_id}"
    )
    rows = [line.split() for line in listing if line.strip()[:1].isdigit()]
    assert [(int(r[0]), r[-1]) for r in rows] == [
        (twins[1].workflow_id, "running"),  # newest first
        (twins[0].workflow_id, "failed"),
    ]
    assert "created" in listing[0] + listing[1]

    missing = invoke(db_dsn, "workflow", "show", "no such thing")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: no workflow is named 'no such thing'")
    assert invoke(db_dsn, "workflow", "show", "0").exit_code == 1
    assert "does not exist" in invoke(db_dsn, "workflow", "show", "999999").stderr
    with pytest.raises(pgqueue.InvalidOption, match="1 to 255"):
        app.list_workflows(name="")
    assert [w.workflow_id for w in app.list_workflows(name="nightly report", status="failed")] == [
        twins[0].workflow_id
    ]


def test_archive_and_prune_take_the_workflow_bookkeeping_along(
    app: pgqueue.App, db_dsn: str
) -> None:
    wf = app.workflow("short-lived")
    first = wf.add("t")
    wf.add("u", after=first)
    run = wf.enqueue()
    for _ in range(2):
        (leased,) = app.lease("default", "w1")
        app.ack(leased)
    assert app.get_workflow(run.workflow_id).status == "succeeded"

    assert app.archive(older_than=0) == 2
    assert app.get_workflow(run.workflow_id).status == "succeeded"  # read from the archive
    assert app.prune(older_than=0)["archived_jobs"] == 2

    with psycopg.connect(db_dsn) as conn:
        left = conn.execute(
            "SELECT (SELECT count(*) FROM pgqueue.workflows),"
            " (SELECT count(*) FROM pgqueue.job_waits),"
            " (SELECT count(*) FROM pgqueue.job_dependencies)"
        ).fetchone()
    assert left == (0, 0, 0)


def test_a_dependency_requeued_after_dying_is_counted_off_once(app: pgqueue.App) -> None:
    wf = app.workflow("requeued")
    a = wf.add("a", {}, queue="qa")
    b = wf.add("b", {}, queue="qb")  # nobody serves qb: c must keep waiting for it
    wf.add("c", {}, after=[a, b], allow_failed=True, queue="qc")
    run = wf.enqueue()

    (first,) = app.lease("qa", "w1")
    app.fail(first, "boom", permanent=True)
    app.requeue_dead(run.jobs["a"])
    (again,) = app.lease("qa", "w1")
    app.ack(again)

    assert app.get_job(run.jobs["c"]).status is JobStatus.WAITING
    assert app.lease("qc", "w1") == []
