"""``python -m benchmarks``: every selected system, same run, same PostgreSQL."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.adapters import SYSTEMS
from benchmarks.common import DB_PREFIX, DEFAULT_DSN
from benchmarks.db import Server
from benchmarks.report import render, summarize, targets
from benchmarks.workloads import ALIASES, WORKLOADS, Ctx, Sizes

DEFAULT_SYSTEMS = ["floor", "pgqueue", "pgqueuer-psycopg", "pgqueuer-asyncpg", "procrastinate"]


def _split(value: str, known: dict[str, Any], aliases: dict[str, list[str]]) -> list[str]:
    out: list[str] = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        names = aliases.get(item, [item])
        for n in names:
            if n not in known:
                raise SystemExit(f"unknown name {n!r}; choose from {', '.join(known)}")
            if n not in out:
                out.append(n)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Side-by-side benchmark of Postgres task queues against a raw-SQL floor.",
    )
    p.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma list from: {', '.join(SYSTEMS)} (default: all)",
    )
    p.add_argument(
        "--workloads",
        default="all",
        help=f"comma list from: {', '.join(WORKLOADS)}; aliases: "
        f"{', '.join(f'{k}' for k in ALIASES)} (default: all)",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--quick", action="store_true", help="shrink every size ~10x (smoke run)")
    p.add_argument(
        "--dsn",
        default=os.environ.get("PGQUEUE_BENCH_DSN", DEFAULT_DSN),
        help="maintenance-database DSN (env PGQUEUE_BENCH_DSN; default %(default)s)",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        default=None,
        help="write raw results and the summary here (default benchmarks/results/<timestamp>.json)",
    )
    p.add_argument(
        "--soak-max-seconds",
        type=float,
        default=None,
        help="time cap per soak run (default 300, quick 60)",
    )
    p.add_argument(
        "--soak-jobs",
        type=int,
        default=None,
        help="jobs per soak run, 0 = no cap, only --soak-max-seconds (default 500000, quick 50000)",
    )
    p.add_argument(
        "--soak-sample-seconds",
        type=float,
        default=None,
        help="sample table and index sizes this often during a soak (default 30, quick 10)",
    )
    p.add_argument(
        "--soak-maintenance-seconds",
        type=float,
        default=None,
        help="run the periodic cleanup of systems that need an operator's cron (PgQueuer: "
        "log pruning; Procrastinate: delete_old_jobs; pgqueue-prev: archive + prune) this "
        "often during a soak; pgqueue's workers apply retention themselves "
        "(default 60, quick 20)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="before each measurement wait up to this many seconds for a quiet machine "
        "(<15%% of the CPUs busy over 1 s); 0 = don't wait (default 60)",
    )
    p.add_argument(
        "--prev-python",
        default=None,
        help="system pgqueue-prev: the python of a venv where the previous pgqueue is "
        "installed (env PGQB_PREV_PYTHON; see benchmarks/README.md)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds a drain may take before it is cut short and its partial rate "
        "(jobs done / time) reported with a note (default 900, quick 300)",
    )
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prev_python:
        # In the environment: the worker processes (spawned) read it too.
        os.environ["PGQB_PREV_PYTHON"] = args.prev_python
    systems = _split(args.systems, SYSTEMS, {"all": list(SYSTEMS)})
    workloads = _split(args.workloads, WORKLOADS, ALIASES)
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.soak_max_seconds is not None:
        sizes.soak_max_seconds = args.soak_max_seconds
    if args.soak_jobs is not None:
        sizes.soak = args.soak_jobs
    if args.soak_sample_seconds is not None:
        sizes.soak_sample_seconds = args.soak_sample_seconds
    if args.soak_maintenance_seconds is not None:
        sizes.soak_maintenance_seconds = args.soak_maintenance_seconds
    if args.drain_timeout is not None:
        sizes.drain_timeout = args.drain_timeout

    notes: list[str] = []
    runnable: list[str] = []
    system_info: dict[str, Any] = {}
    for s in systems:
        cls = SYSTEMS[s]
        reason = cls.unavailable_reason()
        if reason:
            notes.append(f"skipped {s}: {reason}")
            log(f"skipping {s}: {reason}")
            system_info[s] = {"skipped": reason}
            continue
        runnable.append(s)
        system_info[s] = {"label": cls.label, "version": cls.version(), "tuning": cls.tuning()}
    if not runnable:
        log("no system can run")
        return 2

    server = Server(args.dsn)
    stale = server.cleanup_stale()
    if stale:
        log(f"dropped {len(stale)} stale benchmark database(s)")
    others = server.other_clients()
    if others:
        msg = f"other client sessions on the server (WAL is cluster-wide): {others}"
        notes.append(msg)
        log("warning: " + msg)

    meta = {
        "started": datetime.now(UTC).isoformat(),
        "argv": sys.argv[1:] if argv is None else argv,
        "quick": args.quick,
        "reps": args.reps,
        "sizes": sizes.__dict__,
        "server": server.info(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "systems": system_info,
        "workloads": workloads,
    }
    log(
        f"Python {sys.version.split()[0]} - PostgreSQL {meta['server'].get('server_version')}"
        f" - systems: {', '.join(runnable)}"
        f" - workloads: {', '.join(workloads)} - reps: {args.reps}"
        + (" - QUICK" if args.quick else "")
    )
    for s in runnable:
        log(
            f"  {s}: {system_info[s]['version']}; "
            + "; ".join(f"{k}={v}" for k, v in system_info[s]["tuning"].items())
        )

    results: list[dict[str, Any]] = []
    t_run = time.perf_counter()
    for rep in range(1, args.reps + 1):
        for w in workloads:
            for s in runnable:
                results.append(run_one(server, s, w, rep, sizes, os.getpid(), args.quiet_wait))
    server.close()
    elapsed = time.perf_counter() - t_run

    for r in results:
        for n in r["metrics"].get("notes", []) if r["ok"] else []:
            notes.append(f"{r['system']} {r['workload']} rep {r['rep']}: {n}")
        if not r["ok"]:
            notes.append(f"{r['system']} {r['workload']} rep {r['rep']} FAILED: {r['error']}")
    with_company = [r for r in results if r.get("other_clients")]
    not_quiet = [r for r in results if not r.get("quiet_check", {}).get("quiet", True)]
    if with_company or not_quiet:
        dbs = sorted({c.split(" ")[0] for r in with_company for c in r["other_clients"]})
        notes.insert(
            0,
            f"NOT A CLEAN RUN: of {len(results)} measurements, {len(not_quiet)} started on a "
            f"busy machine (>15% CPU busy after the quiet wait) and {len(with_company)} had "
            f"foreign client sessions on the server (databases: {', '.join(dbs) or '-'}); "
            "CPU used by others distorts rates and latencies, their writes the WAL bytes",
        )
    summary = summarize(results)
    meta["elapsed_seconds"] = elapsed
    if args.quick:
        notes.insert(0, "QUICK run: sizes shrunk ~10x (workload names keep full-size labels)")
    for s in runnable:
        notes.append(
            f"{s} tuning: " + "; ".join(f"{k}={v}" for k, v in system_info[s]["tuning"].items())
        )
    print()
    print(
        f"Python {sys.version.split()[0]} ({sys.executable}, worker processes too) - "
        f"PostgreSQL {meta['server'].get('server_version')} - {platform.platform()}"
    )
    render(summary, notes)

    path = (
        Path(args.json_path)
        if args.json_path
        else (Path(__file__).parent / "results" / f"{datetime.now():%Y%m%d-%H%M%S}.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "meta": meta,
                "summary": summary,
                "targets": targets(summary),
                "results": results,
                "notes": notes,
            },
            indent=1,
            default=str,
        )
    )
    log(f"\nwrote {path} ({elapsed:.0f}s)")
    return 0 if all(r["ok"] for r in results) else 1


def _cpu_busy(sample: float = 1.0) -> float | None:
    """Fraction of all CPUs busy over ``sample`` seconds (Linux /proc/stat), else None."""

    def read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    a = read()
    time.sleep(sample)
    b = read()
    if a is None or b is None or b[1] == a[1]:
        return None
    return 1.0 - (b[0] - a[0]) / (b[1] - a[1])


def wait_quiet(server: Server, max_wait: float) -> dict[str, Any]:
    """Wait up to ``max_wait`` s for a quiet machine (under 15% CPU busy over one
    second); also lists foreign client sessions. Returns what was seen."""
    t0 = time.monotonic()
    busy: float | None = None
    others: list[str] = []
    while True:
        others = server.other_clients()
        busy = _cpu_busy()
        # Idle foreign sessions do no harm; CPU use by anyone does.
        quiet = busy is None or busy < 0.15
        if quiet or time.monotonic() - t0 >= max_wait:
            return {
                "quiet": quiet,
                "waited_seconds": round(time.monotonic() - t0, 1),
                "cpu_busy": busy,
                "other_clients": others,
            }
        time.sleep(2.0)


def run_one(
    server: Server,
    system: str,
    workload: str,
    rep: int,
    sizes: Sizes,
    pid: int,
    quiet_wait: float = 0.0,
) -> dict[str, Any]:
    dbname = f"{DB_PREFIX}{pid}_{rep}_{workload}_{system}".replace("-", "_").lower()[:63]
    log(f"rep {rep} {workload:<14} {system:<17} ...")
    t0 = time.perf_counter()
    record: dict[str, Any] = {"rep": rep, "workload": workload, "system": system}
    if quiet_wait > 0:
        record["quiet_check"] = q = wait_quiet(server, quiet_wait)
        if not q["quiet"]:
            log(
                f"    ! machine not quiet after {q['waited_seconds']}s (cpu busy "
                f"{q['cpu_busy']}, {len(q['other_clients'])} foreign sessions); measuring anyway"
            )
    before = server.other_clients()
    record["loadavg_before"] = os.getloadavg()[0]
    dsn = server.create_db(dbname)
    adapter = SYSTEMS[system](dsn)
    try:
        adapter.setup()
        ctx = Ctx(server=server, system=adapter, dbname=dbname, dsn=dsn, sizes=sizes, log=log)
        metrics = WORKLOADS[workload](ctx)
        record.update(ok=True, metrics=metrics)
        log(f"    {_one_line(workload, metrics)}  [{time.perf_counter() - t0:.1f}s]")
    except Exception as e:
        record.update(
            ok=False, error=f"{type(e).__name__}: {e}", metrics={}, traceback=traceback.format_exc()
        )
        log(f"    FAILED: {type(e).__name__}: {e}")
    finally:
        try:
            adapter.close()
        except Exception as e:
            log(f"    (close failed: {e})")
        try:
            server.drop_db(dbname)
        except Exception as e:
            log(f"    (drop database failed: {e})")
    record["loadavg_after"] = os.getloadavg()[0]
    others = sorted(set(before) | set(server.other_clients()))
    record["other_clients"] = others
    if others:
        log(f"    ! other client sessions on the server: {len(others)} ({others[:3]}...)")
    return record


def _one_line(workload: str, m: dict[str, Any]) -> str:
    keys = [
        "rate",
        "p50_ms",
        "p99_ms",
        "ratio",
        "held_ratio",
        "after_ratio",
        "rate_backlog",
        "rate_empty",
    ]
    parts = [f"{k}={m[k]:.4g}" for k in keys if isinstance(m.get(k), int | float)]
    whole = m.get("whole")
    if isinstance(whole, dict) and whole.get("cpu_us_per_job") is not None:
        parts.append(
            f"whole life: {whole['cpu_us_per_job']:.1f} us/job "
            f"{whole['wal_bytes_per_job']:.0f} B/job"
        )
    if m.get("skipped"):
        parts.append(f"skipped: {m['skipped']}")
    c = m.get("cost")
    if isinstance(c, dict) and "wal_bytes_per_job" in c:
        parts.append(f"wal/job={c['wal_bytes_per_job']:.0f} commits/job={c['commits_per_job']:.3f}")
    return " ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
