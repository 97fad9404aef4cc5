"""pgqueue in a FastAPI service with SQLAlchemy (async, psycopg driver).

- ``POST /orders?item=book`` inserts an order and enqueues ``send_receipt`` in
  the request's SQLAlchemy session: both commit, or neither does.
- The worker runs in-process, started and stopped by the app's lifespan.
- ``send_receipt`` marks the order in the transaction that records its job
  succeeded (``context.transaction()``).
- The dashboard is mounted at ``/queue`` when ``pgqueue[dashboard]`` is installed.

Run it::

    export DATABASE_URL=postgresql://postgres@127.0.0.1:5432/shop
    pgqueue migrate
    uvicorn examples.fastapi_shop.main:api
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

import pgqueue

metadata = sa.MetaData()
orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("item", sa.Text, nullable=False),
    sa.Column("job_id", sa.BigInteger),
    sa.Column("receipt_sent", sa.Boolean, nullable=False, server_default=sa.false()),
)


def sqlalchemy_url(database_url: str) -> str:
    """The SQLAlchemy URL of a libpq URL, on the psycopg (3) driver that
    pgqueue shares transactions with."""
    scheme, sep, rest = database_url.partition("://")
    if not sep or scheme not in ("postgres", "postgresql"):
        raise ValueError(f"expected a postgresql:// URL, got {database_url!r}")
    return f"postgresql+psycopg://{rest}"


def create_api(database_url: str, *, worker_concurrency: int = 4) -> FastAPI:
    """The service: its database engine, its queue, its routes."""
    queue = pgqueue.App(dsn=database_url)
    engine = create_async_engine(sqlalchemy_url(database_url))
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    @queue.task(pass_context=True, max_attempts=10)
    async def send_receipt(order_id: int, context: pgqueue.JobContext) -> None:
        # ... send the e-mail here (it may be sent twice if a worker dies right
        # after it; the flag below is written exactly once) ...
        async with context.transaction() as conn:
            await conn.execute("UPDATE orders SET receipt_sent = true WHERE id = %s", (order_id,))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        stop = asyncio.Event()
        worker = asyncio.create_task(
            queue.run_worker_async(
                stop=stop, concurrency=worker_concurrency, install_signal_handlers=False
            )
        )
        try:
            yield
        finally:
            stop.set()
            await worker
            await queue.close_async()
            await engine.dispose()

    api = FastAPI(title="shop", lifespan=lifespan)
    api.state.queue = queue

    try:  # pgqueue[dashboard] is optional
        from pgqueue.dashboard import create_app as create_dashboard
    except ImportError:
        pass
    else:
        api.mount("/queue", create_dashboard(queue, read_only=True))

    async def session() -> AsyncIterator[AsyncSession]:
        async with sessions() as s:
            yield s

    @api.post("/orders", status_code=201)
    async def place_order(
        item: str, fail: bool = False, s: AsyncSession = Depends(session)
    ) -> dict[str, Any]:
        """Insert the order and enqueue its receipt in one transaction."""
        async with s.begin():
            order_id = (
                await s.execute(orders.insert().values(item=item).returning(orders.c.id))
            ).scalar_one()
            job = await queue.enqueue_async("send_receipt", {"order_id": order_id}, conn=s)
            await s.execute(
                orders.update().where(orders.c.id == order_id).values(job_id=job.job_id)
            )
            if fail:  # leaving the block with an exception rolls back order and job
                raise HTTPException(status_code=402, detail="payment declined")
        return {"order": order_id, "job_id": job.job_id}

    @api.get("/orders/{order_id}")
    async def get_order(order_id: int, s: AsyncSession = Depends(session)) -> dict[str, Any]:
        row = (await s.execute(sa.select(orders).where(orders.c.id == order_id))).mappings().first()
        if row is None:
            raise HTTPException(status_code=404, detail="no such order")
        return dict(row)

    return api


api = create_api(os.environ.get("DATABASE_URL", "postgresql://localhost/shop"))
