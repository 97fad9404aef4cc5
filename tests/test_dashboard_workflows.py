"""The dashboard's workflow pages and the job page's tags, meta, progress and
snoozes; the jobs list filtered by tag and by waiting."""

from __future__ import annotations

import psycopg

import pgqueue
from tests.dashboard_support import client


def test_workflow_pages_draw_the_graph_with_each_steps_status(app: pgqueue.App) -> None:
    wf = app.workflow("checkout-7")
    fetch = wf.add("fetch_order")
    charge = wf.add("charge_card", after=fetch)
    stock = wf.add("reserve_stock", after=fetch)
    wf.add("ship_order", after=[charge, stock])
    run = wf.enqueue()

    with client(app) as http:
        listing = http.get("/workflows")
        page = http.get(f"/workflows/{run.workflow_id}")
        api = http.get(f"/api/workflows/{run.workflow_id}").json()
        waiting = http.get("/jobs", params={"status": "waiting"})

    assert listing.status_code == 200
    assert f"/workflows/{run.workflow_id}" in listing.text
    assert "checkout-7" in listing.text
    assert page.status_code == 200
    for name, job_id in run.jobs.items():
        assert f'id="step-{job_id}"' in page.text
        assert name in page.text
    assert page.text.index("fetch_order") < page.text.index("ship_order")
    assert "status-waiting" in page.text
    assert api["steps"]["ship_order"]["status"] == "waiting"
    assert api["after"]["ship_order"] == ["charge_card", "reserve_stock"]
    assert waiting.status_code == 200
    assert f"/jobs/{run.jobs['ship_order']}" in waiting.text


def test_the_job_page_shows_tags_meta_progress_and_snoozes(app: pgqueue.App, db_dsn: str) -> None:
    tagged = app.enqueue("t", tags=["tenant:9", "nightly"], meta={"by": "ops"}).job_id
    app.enqueue("t", tags=["other"])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgqueue.jobs SET progress = '{\"done\": 3}', snoozes = 2 WHERE id = %s",
            (tagged,),
        )
    with client(app) as http:
        page = http.get(f"/jobs/{tagged}")
        by_tag = http.get("/jobs", params={"tag": "tenant:9"})
        bad = http.get("/jobs", params={"tag": "no spaces"})

    assert page.status_code == 200
    assert "tenant:9" in page.text
    assert "&#34;by&#34;" in page.text or '"by"' in page.text
    assert "2 snoozes" in page.text
    assert "done" in page.text
    assert by_tag.status_code == 200
    assert f"/jobs/{tagged}" in by_tag.text
    assert "other" not in by_tag.text.split("<tbody>")[-1]
    assert bad.status_code == 400
