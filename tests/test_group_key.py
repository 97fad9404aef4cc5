"""``group_key``: the group (tenant, customer, API key, domain) a job belongs
to, on every enqueue path, stored on the job, shown and filtered by; a bad key
is refused with a clear error and nothing written."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import pgqueue
from pgqueue.errors import InvalidOption
from tests.cli_support import run_cli
from tests.fixtures.dbstate import snapshot
from tests.http_support import Server
from tests.test_http import server  # noqa: F401 (fixture)
from tests.test_security_grants import roles  # noqa: F401 (fixture)


def stored(dsn: str, job_id: int) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT group_key FROM pgqueue.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, job_id
    return row[0]


def test_every_python_path_stores_the_group_key(app: pgqueue.App) -> None:
    @app.task(name="known")
    def known() -> None: ...

    one = app.enqueue("t", group_key="tenant-1").job_id  # enqueue_job, unknown task
    hot = app.enqueue("known", group_key="tenant-2").job_id  # enqueue_job, known task
    labelled = app.enqueue("t", tags=["x"], group_key="tenant-3").job_id  # enqueue_batch
    deduped = app.enqueue("t", dedup_key="d", group_key="tenant-4").job_id
    windowed = app.enqueue("t", dedup_key="w", dedup_window=60, group_key="tenant-5").job_id
    shared = app.enqueue_many(  # enqueue_payloads: every field but the payload shared
        [pgqueue.JobSpec("t", {"n": n}, group_key="tenant-6") for n in range(3)]
    )
    mixed = app.enqueue_many(  # enqueue_batch: the keys differ
        [pgqueue.JobSpec("t", {}, group_key=f"g{n}") for n in range(3)]
        + [pgqueue.JobSpec("t", {}, dedup_key="k", group_key="g-dedup")]
    )
    optioned = known.with_options(group_key="tenant-7").enqueue().job_id
    dependent = app.enqueue("t", depends_on=[one], group_key="tenant-8").job_id
    flow = app.workflow("wf")
    first = flow.add("t", group_key="tenant-9")
    flow.add("t", after=first, name="second", group_key="tenant-10")
    steps = flow.enqueue()
    ungrouped = app.enqueue("t").job_id

    expected = {
        one: "tenant-1",
        hot: "tenant-2",
        labelled: "tenant-3",
        deduped: "tenant-4",
        windowed: "tenant-5",
        **{e.job_id: "tenant-6" for e in shared},
        **{e.job_id: g for e, g in zip(mixed, ["g0", "g1", "g2", "g-dedup"], strict=True)},
        optioned: "tenant-7",
        dependent: "tenant-8",
        ungrouped: None,
    }
    for job_id, key in expected.items():
        assert stored(app.dsn, job_id) == key, job_id
        assert app.get_job(job_id).group_key == key, job_id
    assert sorted(stored(app.dsn, i) for i in steps.jobs.values()) == [
        "tenant-10",
        "tenant-9",
    ]
    # A replay keeps the group.
    assert app.get_job(app.replay(one).job_id).group_key == "tenant-1"


def test_same_key_twice_is_a_dedup_hit_whatever_the_group(app: pgqueue.App) -> None:
    a = app.enqueue("t", dedup_key="same", group_key="a")
    b = app.enqueue("t", dedup_key="same", group_key="b")
    assert (b.job_id, b.created) == (a.job_id, False)
    assert app.get_job(a.job_id).group_key == "a"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "group_key must be a non-empty string"),
        ("x" * 201, "at most 200 characters"),
        ("a\nb", "control characters"),
        ("tab\there", "control characters"),
        (42, "group_key must be a non-empty string"),
    ],
)
def test_bad_keys_are_refused_and_nothing_is_written(
    app: pgqueue.App, db_dsn: str, key: Any, message: str
) -> None:
    app.enqueue("t")  # the queue exists: a refusal must not even touch it
    before = snapshot(db_dsn)
    for call in (
        lambda: app.enqueue("t", group_key=key),
        lambda: app.enqueue_many([pgqueue.JobSpec("t", {}, group_key=key)] * 2),
        lambda: app.enqueue_many(
            [pgqueue.JobSpec("t", {}), pgqueue.JobSpec("t", {"n": 2}, group_key=key)]
        ),
    ):
        with pytest.raises(InvalidOption, match=message):
            call()
    assert snapshot(db_dsn) == before


def test_200_characters_of_any_script_are_a_good_key(app: pgqueue.App) -> None:
    key = "é" * 199 + "文"
    job_id = app.enqueue("t", group_key=key).job_id
    assert app.get_job(job_id).group_key == key


def test_list_jobs_filters_by_group(app: pgqueue.App) -> None:
    a1 = app.enqueue("t", group_key="a").job_id
    b1 = app.enqueue("t", group_key="b").job_id
    a2 = app.enqueue("t", queue="other", group_key="a").job_id
    app.enqueue("t")
    assert [j.id for j in app.list_jobs(group_key="a")] == [a2, a1]
    assert [j.id for j in app.list_jobs(group_key="b")] == [b1]
    assert [j.id for j in app.list_jobs(queue="other", group_key="a")] == [a2]
    assert [j.id for j in app.list_jobs(group_key="none")] == []
    assert len(app.list_jobs()) == 4
    page = app.list_jobs(group_key="a", limit=1)
    assert [j.id for j in page] == [a2]
    assert [j.id for j in app.list_jobs(group_key="a", cursor=page.next_cursor)] == [a1]
    with pytest.raises(InvalidOption, match="group_key"):
        app.list_jobs(group_key="")


def test_sql_enqueue_takes_group_key(app: pgqueue.App, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:

        def call(text: str) -> int:
            row = conn.execute(text).fetchone()
            assert row is not None
            return int(row[0])

        plain = call("SELECT pgqueue.enqueue('t', group_key => 'sql-1')")
        tagged = call("SELECT pgqueue.enqueue('t', tags => ARRAY['x'], group_key => 'sql-2')")
        after = call(f"SELECT pgqueue.enqueue('t', depends_on => ARRAY[{plain}]::bigint[],"
                     " group_key => 'sql-3')")  # fmt: skip
        job = call("SELECT job_id FROM pgqueue.enqueue_job('t', p_group_key => 'sql-4')")
        batch = call(
            """SELECT job_id FROM pgqueue.enqueue_batch('[{"task": "t", "group_key": "sql-5"}]')"""
        )
        ids = [plain, tagged, after, job, batch]
        assert [stored(db_dsn, i) for i in ids] == [f"sql-{n}" for n in range(1, 6)]
        before = snapshot(db_dsn)
        for bad in (
            "SELECT pgqueue.enqueue('t', group_key => '')",
            f"SELECT pgqueue.enqueue('t', group_key => '{'x' * 201}')",
            "SELECT pgqueue.enqueue('t', group_key => E'a\\nb')",
            "SELECT pgqueue.enqueue('t', tags => ARRAY['x'], group_key => '')",
            """SELECT pgqueue.enqueue_batch('[{"task": "t"}, {"task": "t", "group_key": ""}]')""",
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="group_key must be"):
                conn.execute(bad)
        assert snapshot(db_dsn) == before


def test_cli_enqueue_group_and_jobs_list_and_show(app: pgqueue.App, db_dsn: str) -> None:
    done = run_cli(db_dsn, "enqueue", "t", "--group", "cli-tenant", "--json")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    assert app.get_job(job_id).group_key == "cli-tenant"
    other = app.enqueue("t", group_key="other").job_id

    listed = run_cli(db_dsn, "jobs", "list", "--group", "cli-tenant", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)["jobs"]
    assert [(j["id"], j["group_key"]) for j in jobs] == [(job_id, "cli-tenant")]

    shown = run_cli(db_dsn, "jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert "cli-tenant" in shown.stdout
    as_json = run_cli(db_dsn, "jobs", "show", str(other), "--json")
    assert json.loads(as_json.stdout)["group_key"] == "other"

    before = snapshot(db_dsn)
    bad = run_cli(db_dsn, "enqueue", "t", "--group", "x" * 201)
    assert bad.returncode != 0
    assert "group_key must be at most 200 characters" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert snapshot(db_dsn) == before


def test_http_enqueue_takes_group_key(
    server: Server,  # noqa: F811
    app: pgqueue.App,
    db_dsn: str,
) -> None:
    with server.client("producer") as http:
        one = http.post("/v1/jobs", json={"task": "t", "group_key": "http-1"})
        many = http.post(
            "/v1/jobs/batch",
            json={"jobs": [{"task": "t", "group_key": "http-2"}, {"task": "t"}]},
        )
        assert one.status_code == 201, one.text
        assert many.status_code == 201, many.text
        before = snapshot(db_dsn)
        bad = [
            http.post("/v1/jobs", json={"task": "t", "group_key": key})
            for key in ("", "x" * 201, "a\u0007b", 7)
        ]
    with server.client() as http:
        spec = http.get("/v1/openapi.json").json()
    with server.client("producer") as http:
        shown = http.get(f"/v1/jobs/{one.json()['job_id']}")
    assert app.get_job(one.json()["job_id"]).group_key == "http-1"
    assert [app.get_job(i).group_key for i in many.json()["job_ids"]] == ["http-2", None]
    assert [b.status_code for b in bad] == [422] * 4, [b.text for b in bad]
    assert all("group_key" in b.text for b in bad)
    assert snapshot(db_dsn) == before
    schema = spec["components"]["schemas"]["EnqueueRequest"]["properties"]
    assert schema["group_key"]["anyOf"][0]["maxLength"] == 200
    assert "group_key" in spec["components"]["schemas"]["Job"]["properties"]
    assert shown.status_code == 200, shown.text
    assert shown.json()["group_key"] == "http-1"


def test_a_running_task_sees_its_group_key(app: pgqueue.App) -> None:
    seen: list[str | None] = []

    @app.task(name="grouped", pass_context=True)
    def grouped(context: pgqueue.JobContext) -> None:
        seen.append(context.group_key)

    grouped.with_options(group_key="ctx").enqueue()
    grouped.enqueue()
    from pgqueue.testing import drain

    drain(app)
    assert sorted(seen, key=str) == ["ctx", None] or sorted(seen, key=str) == [None, "ctx"]


def test_the_dashboard_job_page_shows_the_group(app: pgqueue.App) -> None:
    from tests.dashboard_support import client

    grouped = app.enqueue("t", group_key="<acme & co>").job_id
    plain = app.enqueue("t").job_id
    with client(app) as c:
        page = c.get(f"/jobs/{grouped}")
        other = c.get(f"/jobs/{plain}")
        api = c.get(f"/api/jobs/{grouped}").json()
    assert page.status_code == 200, page.text[:300]
    assert '<dd id="group">&lt;acme &amp; co&gt;</dd>' in page.text
    assert 'id="group"' not in other.text
    assert api["group_key"] == "<acme & co>"
