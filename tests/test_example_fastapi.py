"""The FastAPI example, through an ASGI client (httpx) with its lifespan
running: enqueue in the request's SQLAlchemy session, in-process worker."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from tests.fixtures.dbstate import row_counts

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")


def test_orders_commit_with_their_job_and_the_worker_runs_it(db_dsn: str) -> None:
    from examples.fastapi_shop.main import create_api

    api = create_api(db_dsn, worker_concurrency=2)

    async def scenario() -> tuple[int, dict[str, object]]:
        transport = httpx.ASGITransport(app=api)
        async with (
            api.router.lifespan_context(api),
            httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
        ):
            placed = await client.post("/orders", params={"item": "book"})
            assert placed.status_code == 201, placed.text
            declined = await client.post("/orders", params={"item": "pen", "fail": "true"})
            assert declined.status_code == 402
            order = placed.json()["order"]
            deadline = time.monotonic() + 60
            while True:
                shown = (await client.get(f"/orders/{order}")).json()
                if shown["receipt_sent"]:
                    return placed.json()["job_id"], shown
                assert time.monotonic() < deadline, "the receipt was never sent"
                await asyncio.sleep(0.05)

    job_id, shown = asyncio.run(scenario())
    assert shown["item"] == "book"
    assert shown["job_id"] == job_id
    with psycopg.connect(db_dsn) as conn:
        items = [r[0] for r in conn.execute("SELECT item FROM orders")]
        status = conn.execute("SELECT status::text FROM pgqueue.jobs WHERE id = %s", (job_id,))
        assert status.fetchone() == ("succeeded",)
    assert items == ["book"]  # the declined order left neither its row nor its job
    assert row_counts(db_dsn)["jobs"] == 1


def test_dashboard_is_mounted_only_when_installed(db_dsn: str) -> None:
    from examples.fastapi_shop.main import create_api

    api = create_api(db_dsn)
    mounted = any(getattr(r, "path", None) == "/queue" for r in api.routes)
    try:
        import pgqueue.dashboard  # noqa: F401
    except ImportError:
        assert not mounted
    else:
        assert mounted
