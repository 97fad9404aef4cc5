"""The overview's throughput line: exact below its caps, and when a figure
is an estimate it says so and gives its exact lower bound."""

from __future__ import annotations

import re

import pytest

import pgqueue
from tests.dashboard_support import client
from tests.fixtures.factory import JobFactory

pytest.importorskip("starlette")


def finish(factory: JobFactory, count: int, status: str, minutes_ago: int, spread: float) -> None:
    """``count`` jobs finished within ``spread`` seconds just before the end
    of the minute that began ``minutes_ago`` minutes ago."""
    factory.ensure_queue("default")
    factory.conn.execute(
        "INSERT INTO pgqueue.jobs (task, queue, payload, status, attempts, run_at, finished_at)"
        " SELECT 't', 'default', '{}', %(status)s::pgqueue.job_status, 1, m.end - interval '1h',"
        "        m.end - make_interval(secs => %(spread)s * i / %(count)s + 0.001)"
        " FROM (SELECT date_trunc('minute', now()) - make_interval(mins => %(ago)s)"
        "              + interval '1 minute' AS end) m,"
        "      generate_series(1, %(count)s) AS i",
        {"status": status, "count": count, "ago": minutes_ago, "spread": spread},
    )


def test_a_late_burst_is_counted_exactly_in_the_hour(
    app: pgqueue.App, job_factory: JobFactory
) -> None:
    # 300 jobs in the last 10 seconds of one minute: more than the chart
    # reads per minute, arriving late (a rate measured from the start of the
    # minute under-counts them). 82 more and 18 dead in quiet minutes.
    finish(job_factory, 300, "succeeded", minutes_ago=5, spread=10)
    finish(job_factory, 82, "succeeded", minutes_ago=20, spread=50)
    finish(job_factory, 18, "dead", minutes_ago=30, spread=50)
    with client(app) as c:
        text = re.sub(r"\s+", " ", c.get("/").text)
        api = c.get("/api/overview").json()
    assert "382 succeeded, 18 dead in the last hour" in text
    assert api["totals"]["succeeded"] == {"value": 382, "at_least": 382, "estimated": False}
    assert api["totals"]["dead"] == {"value": 18, "at_least": 18, "estimated": False}
    burst = [m for m in api["throughput"] if m["succeeded"] >= 100]
    assert len(burst) == 1
    assert burst[0]["estimated"]  # the bar of that minute is an estimate


def test_an_estimate_says_so_and_gives_its_lower_bound(
    app: pgqueue.App, job_factory: JobFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgqueue.dashboard import data

    # Caps small enough that the hour itself is past them.
    monkeypatch.setattr(data, "THROUGHPUT_HOUR_CAP", 250)
    finish(job_factory, 300, "succeeded", minutes_ago=5, spread=10)
    with client(app) as c:
        text = re.sub(r"\s+", " ", c.get("/").text)
        api = c.get("/api/overview").json()
    total = api["totals"]["succeeded"]
    assert total["estimated"]
    assert total["at_least"] == 250
    assert total["value"] >= 250
    assert f"≈{total['value']:,} (at least 250) succeeded" in text
    assert "Totals past 250 are estimates" in text
