"""Runs an older pgqueue (``pgqueue-prev``) in its own interpreter.

Started by :mod:`benchmarks.adapters.pgqueue_prev` with the python of a venv
where the previous pgqueue is installed, as ``PY -I prev_driver.py MODE``:
``-I`` keeps the script's directory, the working directory and PYTHONPATH
off ``sys.path``, so ``import pgqueue`` finds the installed old package and
never this checkout's. Self-contained on purpose: only the standard library,
psycopg and that pgqueue are imported (not ``benchmarks``).

Modes (the protocol is JSON lines on a private copy of stdout; the real
fd 1 is pointed at stderr, so a library's prints cannot corrupt it):

- ``probe``: one line ``{"pgqueue_file", "version", "event_loop", "payload_json"}``.
- ``serve DSN``: a producer. Reads one JSON command per stdin line and
  answers one line ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``:
  ``migrate``; ``bulk n`` and ``single n`` (answer ``max_id``); ``one``
  (``id``); ``archive older_than statuses batch_size`` (``archived``);
  ``prune older_than batch_size`` (``attempts``, ``archived_jobs``);
  ``counts`` (what ``archive_count``/``prune_count`` see now, all statuses);
  ``reset`` (close the App, its connections, and build a new one); ``quit``.
- ``worker DSN OPTIONS_JSON``: one worker process. Builds the App and the
  no-op task, prints ``ready``, waits for ``go`` on stdin, runs
  ``run_worker_async`` until ``stop`` (or end of stdin), then writes the
  recorded task starts (latency probe) to ``out_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

SCHEMA = "pgqueue"
FINISHED = ("succeeded", "dead", "cancelled")


def _protocol_out() -> Any:
    """A private copy of stdout for the protocol; fd 1 then goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "w", buffering=1)


def _send(out: Any, obj: Any) -> None:
    out.write(json.dumps(obj, default=str) + "\n")
    out.flush()


def _loop_factory() -> Any:
    try:
        from pgqueue.worker.runner import loop_factory
    except ImportError:
        return None
    return loop_factory(os.environ.get("PGQB_PGQUEUE_LOOP", "auto"))


def _json_library() -> str:
    try:
        from pgqueue.payloads import orjson
    except ImportError:
        return "json"
    return "orjson" if orjson() is not None else "json"


def _make_app(dsn: str, starts: list[tuple[int, float]] | None) -> Any:
    import pgqueue

    app = pgqueue.App(dsn=dsn, schema=SCHEMA)
    if starts is not None:

        @app.task(name="noop", pass_context=True)
        async def noop_recorded(context: Any) -> None:
            starts.append((int(context.job_id), time.time()))
    else:

        @app.task(name="noop")
        async def noop() -> None:
            return None

    return app


def probe() -> None:
    out = _protocol_out()
    import pgqueue

    _send(
        out,
        {
            "pgqueue_file": pgqueue.__file__,
            "version": getattr(pgqueue, "__version__", "?"),
            "has": [n for n in ("App", "JobSpec") if hasattr(pgqueue, n)],
            "archive": hasattr(pgqueue.App, "archive") and hasattr(pgqueue.App, "prune"),
            "event_loop": "uvloop" if _loop_factory() is not None else "asyncio",
            "payload_json": _json_library(),
            "python": sys.version.split()[0],
        },
    )


def serve(dsn: str) -> None:
    out = _protocol_out()
    import pgqueue

    app = _make_app(dsn, None)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "quit":
                _send(out, {"ok": True})
                break
            try:
                res: dict[str, Any]
                if op == "reset":
                    # What close() is to an App in the runner: its connections
                    # go (their backends flush statistics as they exit); the
                    # next command builds a new App, which connects anew.
                    app.close()
                    app = _make_app(dsn, None)
                    res = {}
                elif op == "migrate":
                    app.migrate()
                    res = {}
                elif op == "bulk":
                    jobs = app.enqueue_many([pgqueue.JobSpec("noop", {}) for _ in range(cmd["n"])])
                    res = {"max_id": max((int(r.job_id) for r in jobs), default=0)}
                elif op == "single":
                    last = 0
                    for _ in range(cmd["n"]):
                        last = int(app.enqueue("noop", {}).job_id)
                    res = {"max_id": last}
                elif op == "one":
                    res = {"id": int(app.enqueue("noop", {}).job_id)}
                elif op == "archive":
                    res = {
                        "archived": app.archive(
                            older_than=cmd["older_than"],
                            statuses=cmd.get("statuses", ["succeeded"]),
                            batch_size=cmd.get("batch_size", 1000),
                        )
                    }
                elif op == "prune":
                    res = dict(
                        app.prune(
                            older_than=cmd["older_than"], batch_size=cmd.get("batch_size", 1000)
                        )
                    )
                elif op == "counts":
                    res = {
                        "archivable": app.archive_count(cmd["older_than"], list(FINISHED)),
                        "prunable": app.prune_count(cmd["older_than"]),
                    }
                else:
                    raise ValueError(f"unknown op {op!r}")
                _send(out, {"ok": True, **res})
            except Exception as e:  # answered, the driver goes on
                _send(out, {"ok": False, "error": f"{type(e).__name__}: {e}"})
    finally:
        with contextlib.suppress(Exception):
            app.close()


def worker(dsn: str, options: dict[str, Any]) -> None:
    out = _protocol_out()
    starts: list[tuple[int, float]] | None = [] if options.get("record") else None
    app = _make_app(dsn, starts)
    go = threading.Event()
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            word = line.strip()
            if word == "go":
                go.set()
            elif word == "stop":
                break
        go.set()
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()

    async def run() -> None:
        stop_async = asyncio.Event()
        _send(out, "ready")
        await asyncio.to_thread(go.wait)
        if stop.is_set():
            return
        kwargs: dict[str, Any] = {}
        if os.environ.get("PGQB_PGQUEUE_METRICS") == "1":
            kwargs["metrics_port"] = 0
        if os.environ.get("PGQB_PGQUEUE_TUNE_GC", "1") == "0":
            kwargs["tune_gc"] = False
        task = asyncio.create_task(
            app.run_worker_async(
                concurrency=options["concurrency"],
                batch_size=options["batch_size"],
                stop=stop_async,
                log_level="warning",
                **kwargs,
            )
        )
        try:
            while not stop.is_set():
                if task.done():
                    task.result()
                    raise RuntimeError("pgqueue worker exited before stop")
                await asyncio.sleep(0.05)
        finally:
            stop_async.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task, 30)
            with contextlib.suppress(Exception):
                await app.close_async()

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(run())
    if starts is not None and options.get("out_path"):
        with open(options["out_path"], "w") as f:
            json.dump(starts, f)


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "probe":
        probe()
    elif mode == "serve":
        serve(argv[1])
    elif mode == "worker":
        worker(argv[1], json.loads(argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
