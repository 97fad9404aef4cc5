"""tags= and meta= on every enqueue path, stored, shown and filtered; bad ones refused
with nothing written."""

from __future__ import annotations

import json

import psycopg
import pytest

import pgqueue
from tests.cli_support import invoke


def count_jobs(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()
    assert row is not None
    return int(row[0])


def test_every_python_path_stores_tags_and_meta(app: pgqueue.App) -> None:
    @app.task(name="t")
    def t() -> None: ...

    one = app.enqueue("t", tags=["a", "tenant:42"], meta={"by": "test"}).job_id
    task_call = t.with_options(tags=["b"], meta={"k": 1}).enqueue().job_id
    shared = app.enqueue_many([pgqueue.JobSpec("t", {"i": i}, tags=["bulk"]) for i in range(3)])
    mixed = app.enqueue_many(
        [pgqueue.JobSpec("t", tags=["x"]), pgqueue.JobSpec("t", meta={"only": "meta"})]
    )
    plain = app.enqueue("t").job_id

    first = app.get_job(one)
    assert (first.tags, first.meta) == (["a", "tenant:42"], {"by": "test"})
    assert (app.get_job(task_call).tags, app.get_job(task_call).meta) == (["b"], {"k": 1})
    assert {tuple(app.get_job(e.job_id).tags) for e in shared} == {("bulk",)}
    assert app.get_job(mixed[0].job_id).tags == ["x"]
    assert app.get_job(mixed[1].job_id).meta == {"only": "meta"}
    assert (app.get_job(plain).tags, app.get_job(plain).meta) == ([], None)


def test_list_jobs_returns_jobs_having_every_tag(app: pgqueue.App) -> None:
    both = app.enqueue("t", tags=["a", "b"]).job_id
    only_a = app.enqueue("t", tags=["a"]).job_id
    app.enqueue("t")

    assert [j.id for j in app.list_jobs(tags=["a"]).jobs] == [only_a, both]
    assert [j.id for j in app.list_jobs(tags=["a", "b"]).jobs] == [both]
    assert app.list_jobs(tags=["c"]).jobs == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tags": "a"}, "tags must be a list of strings"),
        ({"tags": ["x"] * 17}, "at most 16"),
        ({"tags": ["has space"]}, "1 to 64 characters"),
        ({"tags": ["x" * 65]}, "1 to 64 characters"),
        ({"meta": [1]}, "meta must be a JSON object"),
        ({"meta": {"a": "x" * 9000}}, "over the 8192-byte limit"),
    ],
)
def test_bad_tags_or_meta_are_refused_and_nothing_is_written(
    app: pgqueue.App, db_dsn: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(pgqueue.InvalidOption, match=message):
        app.enqueue("t", **options)  # type: ignore[arg-type]
    with pytest.raises(pgqueue.InvalidOption, match=message):
        app.enqueue_many([pgqueue.JobSpec("t"), pgqueue.JobSpec("t", **options)])  # type: ignore[arg-type]
    assert count_jobs(db_dsn) == 0


def test_the_sql_api_takes_tags_and_meta_and_checks_them(app: pgqueue.App, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pgqueue.enqueue('t', tags => ARRAY['sql', 'x.y'], meta => '{\"m\": 1}')"
        ).fetchone()
        assert row is not None
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="tags must be"):
            conn.execute("SELECT pgqueue.enqueue('t', tags => ARRAY['no spaces please'])")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="meta must be"):
            conn.execute("SELECT pgqueue.enqueue('t', meta => '[1]')")
    job = app.get_job(row[0])
    assert (job.tags, job.meta) == (["sql", "x.y"], {"m": 1})
    assert count_jobs(db_dsn) == 1


def test_cli_enqueue_tag_meta_and_jobs_list_tag(app: pgqueue.App, db_dsn: str) -> None:
    done = invoke(db_dsn, "enqueue", "t", "--tag", "cli", "--tag", "n:1", "--meta", '{"a": 2}')
    assert done.exit_code == 0, done.stderr
    invoke(db_dsn, "enqueue", "t", "--tag", "other")
    listed = invoke(db_dsn, "jobs", "list", "--tag", "cli", "--json")
    assert listed.exit_code == 0, listed.stderr
    jobs = json.loads(listed.stdout)["jobs"]
    assert [(j["tags"], j["meta"]) for j in jobs] == [(["cli", "n:1"], {"a": 2})]
    shown = invoke(db_dsn, "jobs", "show", str(jobs[0]["id"]))
    assert "cli, n:1" in shown.stdout


def test_a_leased_job_and_its_context_carry_tags_and_meta(app: pgqueue.App) -> None:
    job_id = app.enqueue("t", tags=["a"], meta={"m": True}).job_id
    (leased,) = app.lease("default", "w1")
    assert (leased.job_id, leased.tags, leased.meta) == (job_id, ["a"], {"m": True})
