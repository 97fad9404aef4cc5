"""``pgqueue-prev``: an earlier pgqueue, run from its own checkout and venv.

For issue #37: the layout before jobs were partitioned by status (c272391):
finished jobs stay in ``jobs`` until the operator's cron runs ``archive``
(moves them to ``jobs_archive``) and ``prune`` (deletes archived jobs and
attempts). Measured beside ``floor`` and ``pgqueue`` in the same run.

The old package is never imported here: everything that needs it (migrate,
enqueue, the worker, archive/prune) runs in subprocesses of the interpreter
given by ``--prev-python PATH`` / ``$PGQB_PREV_PYTHON`` (the python of a venv
where the old pgqueue is installed), through :mod:`benchmarks.prev_driver`.
A worker process of the benchmark's spawner (same ready/go/stop protocol as
every system) starts the old worker as its child and relays *go* and *stop*;
its child's CPU counts as the worker's (``worker_subprocess``). The runner's
own reads (remaining jobs, sizes, the soak's accounting) are plain SQL.

Set up a checkout::

    git -C /work/main worktree add --detach /work/prev-c272391 c272391
    python3 -m venv /work/prev-c272391/.venv
    /work/prev-c272391/.venv/bin/pip install -q -e /work/prev-c272391
    python -m benchmarks --prev-python /work/prev-c272391/.venv/bin/python ...
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, ClassVar

import psycopg

from benchmarks.adapters.base import System
from benchmarks.common import WorkerControl

ENV = "PGQB_PREV_PYTHON"
DRIVER = str(Path(__file__).resolve().parent.parent / "prev_driver.py")
#: This checkout's package: the prev interpreter must not import it.
THIS_PACKAGE = Path(__file__).resolve().parent.parent.parent / "pgqueue"
SCHEMA = "pgqueue"
CONCURRENCY = 500
BATCH_SIZE = 500
FINISHED = ("succeeded", "dead", "cancelled")
#: life: the operator's cron once the jobs are past retention, as the old README
#: had it (CLI defaults: batches of 1,000), every finished status.
LIFE_BATCH = 1_000
#: soak: as docs/storage-layout.md's soak of the old layout ran it, every
#: --soak-maintenance-seconds: archive jobs finished over a minute ago, then prune
#: archived jobs and attempts over two minutes old, batches of 5,000.
SOAK_ARCHIVE_AGE = 60.0
SOAK_PRUNE_AGE = 120.0
SOAK_BATCH = 5_000

REMAINING_SQL = (
    "SELECT count(*) FROM pgqueue.jobs WHERE id > %(after)s AND id <= %(upto)s"
    " AND status IN ('queued', 'scheduled', 'running')"
)


def prev_python() -> str | None:
    return os.environ.get(ENV) or None


def _command(*args: str) -> list[str]:
    py = prev_python()
    assert py is not None
    # -I: neither the script's directory nor the working directory nor
    # PYTHONPATH on sys.path: `import pgqueue` finds the venv's old package.
    return [py, "-I", DRIVER, *args]


class _Driver:
    """A producer subprocess (``prev_driver.py serve``): one command at a time."""

    def __init__(self, dsn: str) -> None:
        self.proc = subprocess.Popen(
            _command("serve", dsn),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=tempfile.gettempdir(),
            text=True,
        )
        self.lock = threading.Lock()

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        with self.lock:
            self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"pgqueue-prev driver exited (code {self.proc.poll()})")
        res: dict[str, Any] = json.loads(line)
        if not res.pop("ok"):
            raise RuntimeError(f"pgqueue-prev {op}: {res['error']}")
        return res

    def close(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            self.call("quit")
            self.proc.wait(30)
        except Exception:
            self.proc.kill()
            self.proc.wait(5)


class ArchiveLedger:
    """Every job accounted for in the old layout: finished = finished rows
    still in ``jobs`` + rows in ``jobs_archive`` (counted at the end, the
    worker and the cron stopped) + archived jobs the cron's ``prune`` reported
    deleting (summed as it ran)."""

    method = (
        "finished = finished rows in jobs + rows in jobs_archive (at the end) "
        "+ archived jobs deleted by prune (as each run reported them)"
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pruned_archived = 0
        self.pruned_attempts = 0
        self.counts: dict[str, int] = {}
        self.missed: list[str] = []  # the interface of LeafLedger: nothing can be missed here
        self.polls = 0

    def add_pruned(self, archived_jobs: int, attempts: int) -> None:
        with self.lock:
            self.pruned_archived += archived_jobs
            self.pruned_attempts += attempts

    def poll(self, mon: psycopg.Connection[Any], final: bool = False) -> None:
        self.polls += 1
        if not final:
            return
        counts = {s: 0 for s in FINISHED}
        for table in ("jobs", "jobs_archive"):
            rows = mon.execute(
                f"SELECT status::text, count(*) FROM {SCHEMA}.{table}"
                " WHERE status::text = ANY(%s) GROUP BY 1",
                (list(FINISHED),),
            ).fetchall()
            for status, n in rows:
                counts[str(status)] += int(n)
                self.counts[f"{table}.{status}"] = int(n)
        self._final = counts

    def finished(self) -> dict[str, int]:
        with self.lock:
            return {
                **getattr(self, "_final", {s: 0 for s in FINISHED}),
                "pruned_archived": self.pruned_archived,
            }

    def report(self) -> dict[str, Any]:
        return {
            "rows_at_end": dict(self.counts),
            "pruned_archived_jobs": self.pruned_archived,
            "pruned_attempts": self.pruned_attempts,
            "leaves_missed": [],
        }


class PgQueuePrev(System):
    name: ClassVar[str] = "pgqueue-prev"
    label: ClassVar[str] = "pgqueue, previous layout (own venv)"
    supports_id_range: ClassVar[bool] = True
    #: the worker process of the spawner runs the old worker as its child
    worker_subprocess: ClassVar[bool] = True
    _probe: ClassVar[dict[str, Any] | None] = None
    _probe_error: ClassVar[str | None] = None

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self._driver: _Driver | None = None
        self._max_id = 0
        self._ledger: ArchiveLedger | None = None
        self._maint: _Driver | None = None

    # ---- discovery -------------------------------------------------------
    @classmethod
    def _probed(cls) -> dict[str, Any] | None:
        if cls._probe is None and cls._probe_error is None:
            try:
                out = subprocess.run(
                    _command("probe"),
                    capture_output=True,
                    text=True,
                    timeout=120,
                    cwd=tempfile.gettempdir(),
                    check=False,
                )
                if out.returncode != 0:
                    tail = (out.stderr.strip().splitlines() or ["?"])[-1]
                    cls._probe_error = f"{prev_python()} cannot import pgqueue: {tail}"
                else:
                    cls._probe = json.loads(out.stdout.strip().splitlines()[-1])
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                cls._probe_error = f"{prev_python()}: {type(e).__name__}: {e}"
        return cls._probe

    @classmethod
    def unavailable_reason(cls) -> str | None:
        py = prev_python()
        if not py:
            return (
                f"give --prev-python PATH (or ${ENV}): the python of a venv with the previous "
                "pgqueue installed (see benchmarks/README.md)"
            )
        if not os.access(py, os.X_OK):
            return f"{ENV}={py} is not an executable"
        probe = cls._probed()
        if probe is None:
            return cls._probe_error
        pkg = Path(probe["pgqueue_file"]).resolve().parent
        if pkg == THIS_PACKAGE:
            return f"{py} imports this checkout's pgqueue ({pkg}), not a previous one"
        missing = [n for n in ("App", "JobSpec") if n not in probe["has"]]
        if missing or not probe["archive"]:
            return f"the pgqueue of {py} has no {', '.join(missing) or 'App.archive/prune'}"
        return None

    @classmethod
    def _checkout(cls) -> tuple[str, str]:
        probe = cls._probed() or {}
        root = Path(probe.get("pgqueue_file", "/")).resolve().parent.parent
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = "?"
        return str(root), commit

    @classmethod
    def version(cls) -> str:
        probe = cls._probed() or {}
        root, commit = cls._checkout()
        return f"pgqueue {probe.get('version', '?')} at {commit} ({root})"

    @classmethod
    def tuning(cls) -> dict[str, Any]:
        probe = cls._probed() or {}
        return {
            "interpreter": f"{prev_python()} (Python {probe.get('python', '?')})",
            "worker": f"app.run_worker_async(concurrency={CONCURRENCY}, batch_size={BATCH_SIZE},"
            " log_level='warning') in a child of the worker process",
            "bulk enqueue": "app.enqueue_many([JobSpec('noop', {})...]) in a driver subprocess",
            "single enqueue": "app.enqueue('noop', {}) in a driver subprocess",
            "remaining count": "custom SQL",
            "event loop": probe.get("event_loop", "?"),
            "payload json": probe.get("payload_json", "?"),
            "life cleanup": f"archive(older_than=0, statuses={'+'.join(FINISHED)}) then "
            f"prune(older_than=0), batches of {LIFE_BATCH}",
            "soak cron": f"archive(older_than={SOAK_ARCHIVE_AGE:.0f}s) then "
            f"prune(older_than={SOAK_PRUNE_AGE:.0f}s), batches of {SOAK_BATCH}",
        }

    # ---- producer side -----------------------------------------------------
    @property
    def driver(self) -> _Driver:
        if self._driver is None or self._driver.proc.poll() is not None:
            self._driver = _Driver(self.dsn)
            # The process ends with this adapter (or at exit): close() only
            # resets its App, so that the interpreter's start and imports are
            # never inside a timed call (pgqueue's are done once, too).
            weakref.finalize(self, self._driver.close)
        return self._driver

    def setup(self) -> None:
        self.driver.call("migrate")

    def bulk_enqueue(self, n: int) -> None:
        self._max_id = max(self._max_id, int(self.driver.call("bulk", n=n)["max_id"]))

    def enqueue_one(self) -> int:
        job_id = int(self.driver.call("one")["id"])
        self._max_id = max(self._max_id, job_id)
        return job_id

    def single_enqueue(self, n: int) -> None:
        # The loop runs in the driver: one round trip to it, not one per job.
        self._max_id = max(self._max_id, int(self.driver.call("single", n=n)["max_id"]))

    def remaining(
        self, mon: psycopg.Connection[Any], upto_id: int | None, after_id: int = 0
    ) -> int:
        row = mon.execute(REMAINING_SQL, {"after": after_id, "upto": upto_id or 2**62}).fetchone()
        assert row is not None
        return int(row[0])

    def max_job_id(self, mon: psycopg.Connection[Any]) -> int:
        return self._max_id

    def close(self) -> None:
        """As pgqueue's close(): the producer's App and its connections go (a
        new one connects on the next call); the soak's cron process ends."""
        if self._driver is not None and self._driver.proc.poll() is None:
            self._driver.call("reset")
        if self._maint is not None:
            self._maint.close()
            self._maint = None

    # ---- whole life: the operator's archive then prune ---------------------
    def finished_storage(self, mon: psycopg.Connection[Any]) -> dict[str, int]:
        """Finished jobs in ``jobs`` by status, rows of ``jobs_archive`` and
        ``job_attempts`` (only those holding rows)."""
        out: dict[str, int] = {}
        for status, n in mon.execute(
            f"SELECT status::text, count(*) FROM {SCHEMA}.jobs"
            " WHERE status::text = ANY(%s) GROUP BY 1 ORDER BY 1",
            (list(FINISHED),),
        ).fetchall():
            out[f"jobs ({status})"] = int(n)
        for table in ("jobs_archive", "job_attempts"):
            row = mon.execute(f"SELECT count(*) FROM {SCHEMA}.{table}").fetchone()
            if row and row[0]:
                out[table] = int(row[0])
        return out

    def cleanup_plan(self, mon: psycopg.Connection[Any]) -> Any:
        """Outside the window: the driver up and connected; what the cron
        would touch now."""
        return self.driver.call("counts", older_than=0)

    def cleanup(self, plan: Any) -> dict[str, Any]:
        archived = self.driver.call(
            "archive", older_than=0, statuses=list(FINISHED), batch_size=LIFE_BATCH
        )
        pruned = self.driver.call("prune", older_than=0, batch_size=LIFE_BATCH)
        return {
            "what": "the operator's cron: archive(older_than=0) then prune(older_than=0)",
            "before": plan,
            **archived,
            **{f"pruned_{k}": v for k, v in pruned.items()},
        }

    # ---- soak: the operator's cron every --soak-maintenance-seconds -------
    def soak_prepare(self) -> dict[str, Any]:
        self._ledger = ArchiveLedger()
        return {
            "maintenance": f"cron: archive(older_than={SOAK_ARCHIVE_AGE:.0f}s, every finished "
            f"status) then prune(older_than={SOAK_PRUNE_AGE:.0f}s), batches of {SOAK_BATCH}",
        }

    def soak_maintenance(self) -> Callable[[], dict[str, Any]] | None:
        def run() -> dict[str, Any]:
            if self._maint is None:
                self._maint = _Driver(self.dsn)  # its own App and connections
            archived = self._maint.call(
                "archive",
                older_than=SOAK_ARCHIVE_AGE,
                statuses=list(FINISHED),
                batch_size=SOAK_BATCH,
            )
            pruned = self._maint.call("prune", older_than=SOAK_PRUNE_AGE, batch_size=SOAK_BATCH)
            if self._ledger is not None:
                self._ledger.add_pruned(
                    int(pruned.get("archived_jobs", 0)), int(pruned.get("attempts", 0))
                )
            return {**archived, **{f"pruned_{k}": v for k, v in pruned.items()}}

        return run

    def soak_groups(self) -> dict[str, str]:
        return {
            "jobs": f"{SCHEMA}.jobs",
            "jobs_archive": f"{SCHEMA}.jobs_archive",
            "job_attempts": f"{SCHEMA}.job_attempts",
        }

    def soak_ledger(self) -> Any:
        if self._ledger is None:
            self._ledger = ArchiveLedger()
        return self._ledger

    # ---- worker side -------------------------------------------------------
    @classmethod
    def worker_main(cls, dsn: str, ctl: WorkerControl) -> None:
        """Relay: start the old worker (a child in the prev interpreter), wait
        for its *ready*, then pass on *go* and *stop*. Its output goes to this
        process's (the worker log); it writes the recorded starts itself."""
        opts = {
            "concurrency": CONCURRENCY,
            "batch_size": BATCH_SIZE,
            "record": ctl.record,
            "out_path": ctl.opts.out_path,
        }
        proc = subprocess.Popen(
            _command("worker", dsn, json.dumps(opts)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=tempfile.gettempdir(),
            text=True,
        )
        stdin: IO[str] | None = proc.stdin
        assert stdin is not None
        assert proc.stdout is not None
        try:
            line = proc.stdout.readline()
            if json.loads(line or "null") != "ready":
                raise RuntimeError(f"pgqueue-prev worker not ready (exit code {proc.wait(30)})")
            ctl.ready()
            ctl.wait_go()
            stdin.write("go\n")
            stdin.flush()
            while not ctl.wait_stop(0.5):
                if proc.poll() is not None:
                    raise RuntimeError(f"pgqueue-prev worker exited (code {proc.returncode})")
            stdin.write("stop\n")
            stdin.flush()
            stdin.close()
            code = proc.wait(60)
            if code != 0:
                raise RuntimeError(f"pgqueue-prev worker exited with code {code}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
