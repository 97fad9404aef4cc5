"""The ``http`` workload: the HTTP API (``pgqueue serve``) beside the Python
API, same run, same database, same job counts.

Starts ``pgqueue serve`` as a user would (one process, uvicorn, its pool of
10) and measures, with ``CLIENTS`` concurrent keep-alive HTTP clients:

- ``enqueue_http``: single ``POST /v1/jobs``, jobs/s;
- ``enqueue_batch_http``: ``POST /v1/jobs/batch`` of ``BATCH`` jobs, jobs/s;
- ``lease_ack_http``: ``CLIENTS`` workers looping ``lease`` (max ``BATCH``)
  then one ``POST /v1/ack`` per batch, jobs/s until the queue is empty;
- ``lease_ack_http_1``: the same one job at a time (lease max 1, ``ack``);

and, for comparison in the same process, the Python API: ``app.enqueue``
in a loop (``enqueue_python``) and ``app.lease``/``app.ack_many`` batches
(``lease_ack_python``). The ``drain-*`` workloads measure ``pgqueue
worker`` itself. Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CLIENTS = 16
BATCH = 50
TOKEN = "bench-token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _enqueue_single(base: str, n: int) -> float:
    import httpx

    headers = {"authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits) as http:
        left = iter(range(n))

        async def client() -> None:
            for i in left:
                answer = await http.post(
                    "/v1/jobs", json={"task": "bench.http", "payload": {"i": i}}
                )
                answer.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        return n / (time.perf_counter() - t0)


async def _enqueue_batches(base: str, n: int) -> float:
    import httpx

    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
        batches = iter(range(0, n, BATCH))

        async def client() -> None:
            for start in batches:
                jobs = [{"task": "bench.http", "payload": {"i": i}}
                        for i in range(start, min(n, start + BATCH))]  # fmt: skip
                (await http.post("/v1/jobs/batch", json={"jobs": jobs})).raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        return n / (time.perf_counter() - t0)


async def _lease_ack(base: str, n: int, batch: int) -> float:
    import httpx

    headers = {"authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=CLIENTS)
    done = 0
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=60) as http:

        async def worker(k: int) -> None:
            nonlocal done
            while done < n:
                answer = await http.post(
                    "/v1/queues/default/lease", json={"worker_id": f"bench-{k}", "max": batch}
                )
                jobs = answer.json()["jobs"]
                if not jobs:
                    return
                if batch == 1:
                    job = jobs[0]
                    await http.post(
                        f"/v1/jobs/{job['job_id']}/ack", json={"attempt_id": job["attempt_id"]}
                    )
                else:
                    acks = [{"job_id": j["job_id"], "attempt_id": j["attempt_id"]} for j in jobs]
                    await http.post("/v1/ack", json={"acks": acks})
                done += len(jobs)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(CLIENTS)))
        return done / (time.perf_counter() - t0)


def _python_figures(dsn: str, n: int) -> dict[str, float]:
    import pgqueue

    with pgqueue.App(dsn) as app:
        t0 = time.perf_counter()
        for i in range(n):
            app.enqueue("bench.python", {"i": i})
        enqueue = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        done = 0
        while leased := app.lease("default", "bench-python", max=BATCH):
            app.ack_many(leased)
            done += len(leased)
        lease_ack = done / (time.perf_counter() - t0)
    return {"enqueue_python": enqueue, "lease_ack_python": lease_ack}


def w_http(ctx: Any) -> dict[str, Any]:
    if ctx.system.name != "pgqueue":
        return {"skipped": "the HTTP API is pgqueue's"}
    n = ctx.sizes.single * 2  # 4,000 jobs (quick: 400) per figure
    port = _free_port()
    with tempfile.TemporaryDirectory() as scratch:
        tokens = Path(scratch) / "tokens"
        digest = hashlib.sha256(TOKEN.encode()).hexdigest()
        tokens.write_text(f"admin {digest}\n")
        env = {**os.environ, "PGQUEUE_DSN": ctx.dsn}
        server = subprocess.Popen(
            [sys.executable, "-m", "pgqueue_cli", "serve", "--tokens", str(tokens),
             "--port", str(port), "--log-level", "error"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    with urllib.request.urlopen(base + "/v1/openapi.json", timeout=1):
                        break
                except OSError:
                    time.sleep(0.1)
            out: dict[str, Any] = {"jobs": n, "clients": CLIENTS, "batch": BATCH}
            out["enqueue_http"] = asyncio.run(_enqueue_single(base, n))
            out["lease_ack_http_1"] = asyncio.run(_lease_ack(base, n, 1))
            out["enqueue_batch_http"] = asyncio.run(_enqueue_batches(base, n))
            out["lease_ack_http"] = asyncio.run(_lease_ack(base, n, BATCH))
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
    out.update(_python_figures(ctx.dsn, n))
    ctx.log(
        "    http: enqueue {enqueue_http:,.0f}/s (batch {enqueue_batch_http:,.0f}/s), "
        "lease+ack {lease_ack_http_1:,.0f}/s one by one, {lease_ack_http:,.0f}/s in batches; "
        "python: enqueue {enqueue_python:,.0f}/s, lease+ack_many {lease_ack_python:,.0f}/s".format(
            **out
        )
    )
    return out
