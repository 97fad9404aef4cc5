"""The dashboard's job lists: a search over windows of ids (each page reads
at most ``SEARCH_WINDOW`` ids below its cursor with ``job_list``, says how
far down it looked, and the pages together find every match once), and a
bulk action acts on what the list shows, its tag filter included."""

from __future__ import annotations

import pytest

import pgqueue
from pgqueue.ops import inspect
from tests.dashboard_support import TOKEN, client
from tests.fixtures.factory import JobFactory


def test_a_search_pages_through_windows_and_finds_every_match_once(
    app: pgqueue.App, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inspect, "SEARCH_WINDOW", 10)
    ids = [
        job_factory.insert(queue="s", payload={"n": i, "tag": "needle" if i % 7 == 0 else "hay"})
        for i in range(45)
    ]
    needles = sorted((j for i, j in enumerate(ids) if i % 7 == 0), reverse=True)
    with client(app) as c:
        found: list[int] = []
        pages = 0
        params = {"q": "needle"}
        cursor = None
        while True:
            pages += 1
            page = c.get(
                "/api/jobs", params={**params, **({"cursor": cursor} if cursor else {})}
            ).json()
            found += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        # Five windows of ten ids (the last one short), each a page.
        assert pages == 5
        assert found == needles
        # A queue filter without a status is a search too; no filter is not.
        page = c.get("/api/jobs", params={"queue": "s"}).json()
        assert [j["id"] for j in page["jobs"]] == sorted(ids, reverse=True)[:10]
        html = c.get("/jobs", params={"q": "needle"}).text
        assert "Searched newest-first down to id" in html
        everything = c.get("/api/jobs").json()["jobs"]
        assert [j["id"] for j in everything] == sorted(ids, reverse=True)


@pytest.mark.parametrize("action", ["cancel", "requeue"])
def test_a_bulk_action_on_a_tag_filter_acts_on_the_tagged_jobs_only(
    app: pgqueue.App, job_factory: JobFactory, action: str
) -> None:
    status = "dead" if action == "requeue" else "queued"
    tagged = [job_factory.insert(queue="b", status=status) for _ in range(3)]
    others = [job_factory.insert(queue="b", status=status) for _ in range(2)]
    job_factory.conn.execute("UPDATE pgqueue.jobs SET tags = '{vip}' WHERE id = ANY(%s)", [tagged])
    with client(app, token=TOKEN) as c:
        auth = {"authorization": f"Bearer {TOKEN}"}
        shown = c.get("/api/jobs", headers=auth, params={"tag": "vip", "queue": "b"}).json()["jobs"]
        assert sorted(j["id"] for j in shown) == sorted(tagged)
        step = c.post(
            "/actions/jobs",
            headers=auth,
            data={"action": action, "scope": "filter", "queue": "b", "tag": "vip", "total": "0"},
        ).json()
        assert step["done"]
        assert step["total"] == 3
    after = dict(
        job_factory.conn.execute(
            "SELECT id, status::text FROM pgqueue.jobs WHERE queue = 'b'"
        ).fetchall()
    )
    acted = "cancelled" if action == "cancel" else "queued"
    assert {after[i] for i in tagged} == {acted}
    assert {after[i] for i in others} == {status}
