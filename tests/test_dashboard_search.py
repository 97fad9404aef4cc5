"""The dashboard's search over windows of ids: each page reads at most one
window (``SEARCH_WINDOW`` ids below its cursor) with ``job_list``, says how
far down it looked, and the pages together find every match once."""

from __future__ import annotations

import pytest

import pgqueue
from pgqueue.ops import inspect
from tests.dashboard_support import client
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
