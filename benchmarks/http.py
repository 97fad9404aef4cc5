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
worker`` itself.

The server's own CPU (user + system of its process, from /proc) is given
per job for each HTTP figure (``*_server_cpu_us``), and per enqueue made by
another process through the Python API while the server is idle
(``idle_server_cpu_us_per_enqueue``) and while one long poll waits on
another queue (``listening_server_cpu_us_per_enqueue``): what a server pays
for notifications that are not its business.

Heavy neighbour: one well-behaved client enqueues small jobs at a steady
``STEADY_RATE``/s, alone (``neighbour_p99_ms_alone``), beside ``HEAVY``
clients looping ~900 KB enqueues (``neighbour_p99_ms_heavy``), and beside
the same heavy clients on a server with a per-token enqueue rate
(``--rate-limit enqueue=HEAVY_RATE``; ``neighbour_p99_ms_limited``).
Figures only: nothing here asserts a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

CLIENTS = 16
BATCH = 50
TOKEN = "bench-token"
HEAVY_TOKENS = ("bench-heavy-1", "bench-heavy-2")
HEAVY = len(HEAVY_TOKENS)
HEAVY_PAYLOAD = 900_000  # bytes of JSON text per heavy enqueue
STEADY_RATE = 5.0  # the well-behaved client's enqueues per second (under the rate below)
STEADY_SECONDS = 20.0
HEAVY_RATE = "8/1s"


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


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Server:
    """``pgqueue serve`` as a process, with the bench tokens."""

    def __init__(self, dsn: str, scratch: Path, *extra: str) -> None:
        tokens = scratch / "tokens"
        lines = [f"admin {hashlib.sha256(TOKEN.encode()).hexdigest()}"]
        lines += [f"producer {hashlib.sha256(t.encode()).hexdigest()}" for t in HEAVY_TOKENS]
        tokens.write_text("\n".join(lines) + "\n")
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pgqueue_cli", "serve", "--tokens", str(tokens),
             "--port", str(self.port), "--log-level", "error", "--no-maintenance",
             "--max-body", str(2 << 20), *extra],
            env={**os.environ, "PGQUEUE_DSN": dsn},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(300):
            if self.process.poll() is not None:
                raise RuntimeError(f"pgqueue serve {' '.join(extra)} did not start")
            try:
                with urllib.request.urlopen(self.base + "/v1/openapi.json", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)

    def cpu(self) -> float:
        return _cpu_seconds(self.process.pid)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _per_job_us(server: _Server, n: int, run: Any) -> tuple[Any, float]:
    """``run()``'s value and the server's CPU per job (µs) while it ran."""
    before = server.cpu()
    value = run()
    return value, (server.cpu() - before) / n * 1e6


def _enqueues_elsewhere(server: _Server, dsn: str, n: int, long_poll: bool) -> float:
    """Server CPU per enqueue (µs) that another process makes with the Python API."""
    import httpx

    import pgqueue

    holder = None
    if long_poll:  # one long poll waits on a queue nobody enqueues into

        def hold() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    server.base + "/v1/queues/nobody/lease",
                    json={"wait": 20},
                    headers={"authorization": f"Bearer {TOKEN}"},
                    timeout=30,
                )

        holder = threading.Thread(target=hold)
        holder.start()
        time.sleep(0.5)
    with pgqueue.App(dsn) as app:
        app.enqueue("bench.elsewhere", {"warm": True}, queue="elsewhere")
        before = server.cpu()
        for i in range(n):
            app.enqueue("bench.elsewhere", {"i": i}, queue="elsewhere")
        time.sleep(0.3)  # the notifications of the last ones are read
        used = server.cpu() - before
    if holder is not None:
        holder.join(30)
    return used / n * 1e6


async def _steady_p99(base: str, heavy: bool) -> dict[str, float]:
    """The well-behaved client's enqueue latency (ms), with or without heavy neighbours."""
    import httpx

    stop = asyncio.Event()
    blob = {"blob": "x" * HEAVY_PAYLOAD}
    refused = 0

    async def heavy_client(token: str) -> None:
        nonlocal refused
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
            while not stop.is_set():
                answer = await http.post(
                    "/v1/jobs", json={"task": "bench.heavy", "payload": blob, "queue": "neighbour"}
                )
                if answer.status_code == 429:
                    refused += 1
                    await asyncio.sleep(float(answer.headers.get("retry-after", "1")))

    heavies = [asyncio.create_task(heavy_client(t)) for t in HEAVY_TOKENS] if heavy else []
    latencies: list[float] = []
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
        await asyncio.sleep(1.0 if heavy else 0.0)
        for i in range(int(STEADY_RATE * STEADY_SECONDS)):
            t0 = time.perf_counter()
            (
                await http.post(
                    "/v1/jobs",
                    json={"task": "bench.steady", "payload": {"i": i}, "queue": "neighbour"},
                )
            ).raise_for_status()
            latencies.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(max(0.0, 1 / STEADY_RATE - (time.perf_counter() - t0)))
    stop.set()
    for task in heavies:
        with contextlib.suppress(Exception):
            await task
    latencies.sort()
    return {
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "heavy_refused": refused,
    }


def w_http(ctx: Any) -> dict[str, Any]:
    if ctx.system.name != "pgqueue":
        return {"skipped": "the HTTP API is pgqueue's"}
    n = ctx.sizes.single * 2  # 4,000 jobs (quick: 400) per figure
    out: dict[str, Any] = {"jobs": n, "clients": CLIENTS, "batch": BATCH}
    with tempfile.TemporaryDirectory() as scratch:
        server = _Server(ctx.dsn, Path(scratch))
        try:
            base = server.base
            for name, run in (
                ("enqueue_http", lambda: asyncio.run(_enqueue_single(base, n))),
                ("lease_ack_http_1", lambda: asyncio.run(_lease_ack(base, n, 1))),
                ("enqueue_batch_http", lambda: asyncio.run(_enqueue_batches(base, n))),
                ("lease_ack_http", lambda: asyncio.run(_lease_ack(base, n, BATCH))),
            ):
                out[name], out[f"{name}_server_cpu_us"] = _per_job_us(server, n, run)
            out["listening_server_cpu_us_per_enqueue"] = _enqueues_elsewhere(
                server, ctx.dsn, n, True
            )
            time.sleep(6.0)  # the long poll ended past the listener's linger: idle again
            out["idle_server_cpu_us_per_enqueue"] = _enqueues_elsewhere(server, ctx.dsn, n, False)
            alone = asyncio.run(_steady_p99(base, heavy=False))
            heavy = asyncio.run(_steady_p99(base, heavy=True))
        finally:
            server.close()
        try:  # a server without per-token rates (an older pgqueue) gives no figure
            limited_server = _Server(
                ctx.dsn, Path(scratch), "--rate-limit", f"enqueue={HEAVY_RATE}"
            )
        except RuntimeError:
            limited = {"p50": float("nan"), "p99": float("nan"), "heavy_refused": 0}
        else:
            try:
                limited = asyncio.run(_steady_p99(limited_server.base, heavy=True))
            finally:
                limited_server.close()
    for name, figures in (("alone", alone), ("heavy", heavy), ("limited", limited)):
        out[f"neighbour_p50_ms_{name}"] = figures["p50"]
        out[f"neighbour_p99_ms_{name}"] = figures["p99"]
    out["heavy_refused_limited"] = limited["heavy_refused"]
    out.update(_python_figures(ctx.dsn, n))
    ctx.log(
        "    http: enqueue {enqueue_http:,.0f}/s ({enqueue_http_server_cpu_us:,.0f} us server CPU "
        "each; batch {enqueue_batch_http:,.0f}/s), lease+ack {lease_ack_http_1:,.0f}/s one by "
        "one, {lease_ack_http:,.0f}/s in batches; python: enqueue {enqueue_python:,.0f}/s, "
        "lease+ack_many {lease_ack_python:,.0f}/s\n"
        "    server CPU per enqueue made elsewhere: idle {idle_server_cpu_us_per_enqueue:.1f} us, "
        "with a long poll on another queue {listening_server_cpu_us_per_enqueue:.1f} us\n"
        "    well-behaved client p99: alone {neighbour_p99_ms_alone:.1f} ms, beside heavy clients "
        "{neighbour_p99_ms_heavy:.1f} ms, heavy clients rate-limited "
        "{neighbour_p99_ms_limited:.1f} ms".format(**out)
    )
    return out
