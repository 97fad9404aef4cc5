"""End-to-end demo: migrate, enqueue real jobs, run `pgqueue worker`, show results.

    PGQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/postgres python examples/quickstart.py

Without a DSN and without a server at 127.0.0.1:5432, it starts a development
PostgreSQL (`pgqueue dev`) when ``pgqueue[embedded]`` is installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pgqueue  # noqa: E402
from pgqueue import embedded  # noqa: E402

# No DSN configured and nothing at 127.0.0.1:5432: start a development
# PostgreSQL when pgqueue[embedded] is installed (one line says where).
try:
    if (dev_dsn := embedded.ensure_for_development()) is not None:
        os.environ["PGQUEUE_DSN"] = dev_dsn
except embedded.EmbeddedUnavailable as exc:
    sys.exit(f"error: {exc}")

from examples.tasks import app  # noqa: E402


def main() -> int:
    app.migrate()
    files = sorted(
        str(p) for p in REPO.glob("**/*")
        if p.suffix in {".py", ".sql", ".md"}
        and not any(part.startswith(".") for part in p.relative_to(REPO).parts)
    )
    specs = [pgqueue.JobSpec("checksum", {"path": f}) for f in files]
    specs += [pgqueue.JobSpec("count_lines", {"path": f}, priority=5) for f in files]
    started = time.monotonic()
    enqueued = app.enqueue_many(specs)
    checksums = [e.job_id for e in enqueued[: len(files)]]
    report = app.enqueue("summarize", {"job_ids": checksums}, queue="reports")
    print(f"enqueued {len(enqueued) + 1} jobs into schema {app.schema!r}")

    # The installed `pgqueue` command, run by this interpreter.
    command = [sys.executable, "-m", "pgqueue_cli", "worker", "--app", "examples.tasks:app",
               "--concurrency", "8", "--log-level", "warning"]
    worker = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        summary = app.result(report.job_id, timeout=120)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    elapsed = time.monotonic() - started
    print(f"worker exited with {code} after {elapsed:.1f}s")
    print(f"summary job: {summary}")
    for queue, m in sorted(app.metrics().items()):
        print(f"  queue {queue:8s} succeeded(last hour)={m.succeeded} dead={m.dead} queued={m.queued}")
    sample = app.get_job(enqueued[0].job_id, history=True)
    print(f"job {sample.id}: {sample.status} result={sample.result} attempts={sample.attempt_history}")
    app.close()
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
