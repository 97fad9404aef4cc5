"""Example tasks: real (small) work on the files of this repository.

Run a worker for them with ``pgqueue worker --app examples.tasks:app``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pgqueue

DSN = os.environ.get("PGQUEUE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
app = pgqueue.App(DSN, schema=os.environ.get("PGQUEUE_SCHEMA", "pgqueue_example"))


@app.task(queue="files", max_attempts=3)
def checksum(path: str) -> dict[str, object]:
    """SHA-256 and size of a file (a sync task: runs in the worker's thread pool)."""
    data = Path(path).read_bytes()
    return {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


@app.task(queue="files", retry=pgqueue.Backoff(base=0.2))
async def count_lines(path: str) -> dict[str, object]:
    """Line count of a text file (an async task: runs on the worker's event loop)."""
    text = await asyncio.to_thread(Path(path).read_text, encoding="utf-8", errors="replace")
    return {"path": path, "lines": text.count("\n")}


@app.task(queue="reports", pass_context=True)
def summarize(job_ids: list[int], context: pgqueue.JobContext) -> dict[str, object]:
    """Collect the results of earlier jobs (waits for each via NOTIFY)."""
    results = [app.result(job_id, timeout=60) for job_id in job_ids]
    total = sum(int(r.get("bytes", 0)) for r in results)
    return {"files": len(results), "bytes": total, "summary_job": context.job_id}
