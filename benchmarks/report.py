"""Summaries (median, min-max, ratio to the floor) and their rendering."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchmarks.common import fmt_num, median

# workload -> [(metric path, column title, higher_is_better)]
HEADLINES: dict[str, list[tuple[str, str, bool]]] = {
    "bulk": [("rate", "jobs/s", True)],
    "single": [("rate", "jobs/s", True), ("rate_plain_insert", "plain INSERT jobs/s", True)],
    "latency": [
        ("p50_ms", "p50 ms", False),
        ("p95_ms", "p95 ms", False),
        ("p99_ms", "p99 ms", False),
        ("max_ms", "max ms", False),
    ],
    "backlog": [
        ("rate_empty", "empty jobs/s", True),
        ("rate_backlog", "backlog jobs/s", True),
        ("ratio", "backlog/empty", True),
        ("rate_backlog_unanalyzed", "before ANALYZE jobs/s", True),
        ("ratio_unanalyzed", "before ANALYZE/empty", True),
    ],
    "xmin": [
        ("rate_clean", "clean jobs/s", True),
        ("rate_held", "held jobs/s", True),
        ("rate_after", "after jobs/s", True),
        ("held_ratio", "held/clean", True),
        ("after_ratio", "after/clean", True),
    ],
    "dashboard": [
        ("max_page_p95_ms", "slowest page p95 ms", False),
        ("max_page_p95_ms_with_sse", "... with 100 SSE clients", False),
        ("sse_refreshes_per_client_per_s", "refreshes/client/s", False),
        ("dashboard_db_sessions", "dashboard DB sessions", False),
    ],
    "http": [
        ("enqueue_http", "HTTP enqueue/s", True),
        ("enqueue_batch_http", "HTTP batch enqueue/s", True),
        ("lease_ack_http_1", "HTTP lease+ack 1/s", True),
        ("lease_ack_http", "HTTP lease+ack batch/s", True),
        ("enqueue_python", "Python enqueue/s", True),
        ("lease_ack_python", "Python lease+ack_many/s", True),
        ("enqueue_http_server_cpu_us", "server CPU us/enqueue", False),
        ("lease_ack_http_1_server_cpu_us", "server CPU us/lease+ack", False),
        ("idle_server_cpu_us_per_enqueue", "idle server CPU us/other enqueue", False),
        ("listening_server_cpu_us_per_enqueue", "... with a long poll", False),
        ("neighbour_p99_ms_alone", "client p99 ms alone", False),
        ("neighbour_p99_ms_heavy", "... heavy neighbours", False),
        ("neighbour_p99_ms_limited", "... neighbours rate-limited", False),
    ],
    "pool": [
        ("cpu_ratio", "CPU-bound process/thread", True),
        ("noop_ratio", "no-op process/thread", True),
        ("noop_process", "no-op process jobs/s", True),
        ("overhead_worker_cpu_us", "process pool +worker CPU us/job", False),
    ],
    "workflows": [
        ("enqueue_ratio", "fan-in enqueue/plain time", False),
        ("leaf_ack_batch1_1p_cpu_ratio", "leaf/plain ack CPU 1p", False),
        ("leaf_ack_batch1_2p_cpu_ratio", "... 2p", False),
        ("leaf_ack_batch1_2p_time_ratio", "leaf/plain ack time 2p", False),
        ("leaf_ack_batch100_2p_cpu_ratio", "... batch 100 CPU 2p", False),
        ("releasing_ack_ratio", "releasing/ordinary ack", False),
    ],
    "durable": [
        ("ack_server_ms", "ack server ms", False),
        ("first_step_ratio", "first step/ack server time", False),
        ("later_step_ratio", "later step/ack server time", False),
        ("load_20_ratio", "load of 20 steps/ack", False),
        ("step_wal_bytes", "WAL B/step", False),
    ],
    "xmin-200k": [
        ("rate_clean", "clean jobs/s", True),
        ("rate_held", "held jobs/s", True),
        ("held_ratio", "held/clean", True),
        ("server_cpu_us_clean", "PG CPU us/job clean", False),
        ("server_cpu_us_held", "PG CPU us/job held", False),
        ("cpu_held_ratio", "PG CPU held/clean", False),
        ("dead_tuples_end_of_hold", "dead tup end of hold", False),
    ],
    "life": [
        ("whole.cpu_us_per_job", "whole life PG CPU us/job", False),
        ("whole.wal_bytes_per_job", "whole life WAL B/job", False),
        ("rate", "drain jobs/s", True),
        ("phases.cleanup.seconds", "cleanup s", False),
    ],
    "soak": [
        ("rate", "jobs/s", True),
        ("jobs", "jobs", True),
        ("size_bytes", "jobs size after", False),
        ("size_growth", "jobs size last/2nd quarter", False),
        ("all_tables_size_bytes", "all tables after", False),
        ("size_growth_all_tables", "all last/2nd quarter", False),
        ("dead_tuples", "dead tuples", False),
        ("all_accounted", "all accounted", True),
    ],
}
# The life workload's phases: each its own column pair (CPU, WAL) in a second table.
LIFE_PHASES = ("enqueue", "drain", "cleanup", "vacuum", "other")
LIFE_PHASE_HEADLINES: list[tuple[str, str, bool]] = [
    (f"phases.{ph}.{m}", f"{ph} {unit}", False)
    for ph in LIFE_PHASES
    for m, unit in (("cpu_us_per_job", "us"), ("wal_bytes_per_job", "B"))
]
DRAIN_HEADLINES: list[tuple[str, str, bool]] = [
    ("rate", "jobs/s", True),
    ("server_cpu_us_per_job", "PG CPU us/job", False),
    ("worker_cpu_us_per_job", "worker CPU us/job", False),
    ("cost.hot_update_ratio", "HOT upd share", True),
]
COST_HEADLINES: list[tuple[str, str, bool]] = [
    ("cost.commits_per_job", "commits/job", False),
    ("cost.rows_inserted_per_job", "ins/job", False),
    ("cost.rows_updated_per_job", "upd/job", False),
    ("cost.rows_deleted_per_job", "del/job", False),
    ("cost.wal_bytes_per_job", "WAL B/job", False),
    ("cost.size_after_bytes", "size after", False),
    ("cost.dead_tuples_after", "dead tup", False),
]
# Ratios to the floor are shown for these metrics only.
RATIO_METRICS = {
    "rate_backlog_unanalyzed",
    "rate",
    "rate_empty",
    "rate_backlog",
    "rate_clean",
    "rate_held",
    "rate_after",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "cost.wal_bytes_per_job",
    "cost.commits_per_job",
    "server_cpu_us_per_job",
    "worker_cpu_us_per_job",
    "whole.cpu_us_per_job",
    "whole.wal_bytes_per_job",
    "server_cpu_us_clean",
    "server_cpu_us_held",
    *(m for m, _, _ in LIFE_PHASE_HEADLINES),
}


def headlines(workload: str) -> list[tuple[str, str, bool]]:
    if workload.startswith("drain"):
        return DRAIN_HEADLINES
    return HEADLINES.get(workload, [])


def get_path(d: dict[str, Any], path: str) -> float | None:
    cur: Any = d
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    if isinstance(cur, bool):
        return 1.0 if cur else 0.0
    if isinstance(cur, int | float):
        return float(cur)
    return None


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{workload: {system: {metric: {median, min, max, n, ratio_to_floor}}}}"""
    out: dict[str, Any] = {}
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    for w in workloads:
        metrics = [m for m, _, _ in headlines(w)]
        if w == "life":
            metrics += [m for m, _, _ in LIFE_PHASE_HEADLINES]
        if w.startswith("drain"):
            metrics += [m for m, _, _ in COST_HEADLINES]
            metrics += [
                "enqueue_rate",
                "cost.wal_fpi",
                "cost.db_tup_inserted_per_job",
                "cost.rows_hot_updated_per_job",
            ]
        per_sys: dict[str, Any] = {}
        systems = list(dict.fromkeys(r["system"] for r in results if r["workload"] == w))
        for s in systems:
            rows = [r for r in results if r["workload"] == w and r["system"] == s and r["ok"]]
            entry: dict[str, Any] = {}
            for m in metrics:
                vals = [
                    v
                    for r in rows
                    if (v := get_path(r["metrics"], m)) is not None and not math.isnan(v)
                ]
                if vals:
                    entry[m] = {
                        "median": median(vals),
                        "min": min(vals),
                        "max": max(vals),
                        "n": len(vals),
                        "values": vals,
                    }
            per_sys[s] = entry
        floor = per_sys.get("floor", {})
        for entry in per_sys.values():
            for m, stat in entry.items():
                f = floor.get(m)
                if f and f["median"] and m in RATIO_METRICS:
                    stat["ratio_to_floor"] = stat["median"] / f["median"]
        out[w] = per_sys
    return out


def _fmt_metric(path: str, v: float) -> str:
    if path == "all_accounted":
        return "yes" if v == 1 else "NO"
    if path.endswith("bytes") or path.endswith("size_bytes") or path == "cost.size_after_bytes":
        return _fmt_bytes(v)
    if path.endswith("ratio") or (path.endswith("_per_job") and v < 10):
        return f"{v:.2f}"
    return fmt_num(v)


def _fmt_bytes(v: float) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= div:
            return f"{v / div:.1f} {unit}"
    return f"{v:.0f} B"


def _cell(stat: dict[str, Any] | None, path: str) -> str:
    if not stat:
        return "-"
    txt = _fmt_metric(path, stat["median"])
    if stat["n"] > 1 and stat["min"] != stat["max"]:
        txt += f" ({_fmt_metric(path, stat['min'])}-{_fmt_metric(path, stat['max'])})"
    if "ratio_to_floor" in stat:
        txt += f" x{stat['ratio_to_floor']:.2f}"
    return txt


def tables(summary: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """[(title, header, rows)] ready to print."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    cost_rows: list[list[str]] = []
    for w, per_sys in summary.items():
        cols = headlines(w)
        extra: list[tuple[str, str, bool]] = []
        if w.startswith("drain"):
            extra = [("enqueue_rate", "bulk enq jobs/s", True)]
        header = ["system"] + [t for _, t, _ in cols + extra]
        rows = [
            [s] + [_cell(entry.get(m), m) for m, _, _ in cols + extra]
            for s, entry in per_sys.items()
        ]
        out.append((w, header, rows))
        if w == "life":
            out.append(
                (
                    "life: PostgreSQL CPU us and WAL B per job, by phase (other = worker "
                    "start/stop, connections, polls)",
                    ["system"] + [t for _, t, _ in LIFE_PHASE_HEADLINES],
                    [
                        [s] + [_cell(entry.get(m), m) for m, _, _ in LIFE_PHASE_HEADLINES]
                        for s, entry in per_sys.items()
                    ],
                )
            )
        if w.startswith("drain"):
            for s, entry in per_sys.items():
                cost_rows.append(
                    [f"{s} [{w}]"] + [_cell(entry.get(m), m) for m, _, _ in COST_HEADLINES]
                )
    if cost_rows:
        out.append(
            (
                "postgres cost per job (enqueue + drain)",
                ["system [workload]"] + [t for _, t, _ in COST_HEADLINES],
                cost_rows,
            )
        )
    return out


def render(summary: dict[str, Any], notes: list[str]) -> None:
    blocks = tables(summary)
    target_rows = targets(summary)
    if target_rows:
        blocks.append(
            (
                "pgqueue against its targets (ratios of medians, this run)",
                ["target", "measured", "verdict"],
                target_rows,
            )
        )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _render_plain(blocks, notes)
        return
    console = Console()
    if console.width < 160:
        console = Console(width=160)
    for title, header, rows in blocks:
        t = Table(title=title, title_justify="left")
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i == 0 else "right")
        for r in rows:
            t.add_row(*r)
        console.print(t)
    if notes:
        console.print("[bold]notes[/bold]")
        for n in notes:
            console.print(f"  - {n}", markup=False)


def _render_plain(blocks: list[tuple[str, list[str], list[list[str]]]], notes: list[str]) -> None:
    for title, header, rows in blocks:
        widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
        print(f"\n{title}")
        print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for r in rows:
            print(
                "  ".join(
                    (c.ljust(w) if i == 0 else c.rjust(w))
                    for i, (c, w) in enumerate(zip(r, widths, strict=True))
                )
            )
    if notes:
        print("\nnotes")
        for n in notes:
            print(f"  - {n}")


# pgqueue's performance targets, as ratios measured inside one run.
# (label, workload, metric, compare-to "system[:metric]" or None, threshold, "ge" | "le")
TARGETS: list[tuple[str, str, str, str | None, float, str]] = [
    ("drain 1 process >= 0.5x floor", "drain-20k-1p", "rate", "floor", 0.5, "ge"),
    ("drain 1 process (100k) >= 0.5x floor", "drain-100k-1p", "rate", "floor", 0.5, "ge"),
    ("drain 2 processes >= 0.4x floor", "drain-20k-2p", "rate", "floor", 0.4, "ge"),
    ("drain 2 processes (100k) >= 0.4x floor", "drain-100k-2p", "rate", "floor", 0.4, "ge"),
    ("bulk enqueue >= 0.5x COPY floor", "bulk", "rate", "floor", 0.5, "ge"),
    ("single enqueue >= 0.9x floor INSERT+NOTIFY", "single", "rate", "floor", 0.9, "ge"),
    (
        "single enqueue >= 0.9x floor plain INSERT",
        "single",
        "rate",
        "floor:rate_plain_insert",
        0.9,
        "ge",
    ),
    ("idle latency p50 <= 1.5x floor", "latency", "p50_ms", "floor", 1.5, "le"),
    ("idle latency p99 <= 2x floor", "latency", "p99_ms", "floor", 2.0, "le"),
    ("idle latency p50 < PgQueuer-asyncpg", "latency", "p50_ms", "pgqueuer-asyncpg", 1.0, "le"),
    ("idle latency p99 < PgQueuer-asyncpg", "latency", "p99_ms", "pgqueuer-asyncpg", 1.0, "le"),
    (
        "WAL/job <= 0.75x PgQueuer (psycopg)",
        "drain-20k-1p",
        "cost.wal_bytes_per_job",
        "pgqueuer-psycopg",
        0.75,
        "le",
    ),
    (
        "WAL/job <= 0.75x PgQueuer (asyncpg)",
        "drain-20k-1p",
        "cost.wal_bytes_per_job",
        "pgqueuer-asyncpg",
        0.75,
        "le",
    ),
    ("deep backlog >= 0.8x empty table", "backlog", "ratio", None, 0.8, "ge"),
    ("held xmin >= 0.65x clean", "xmin", "held_ratio", None, 0.65, "ge"),
    ("after release >= 0.95x clean (recovery)", "xmin", "after_ratio", None, 0.95, "ge"),
    (
        "held snapshot, 200k backlog >= 0.9x clean",
        "xmin-200k",
        "held_ratio",
        None,
        0.9,
        "ge",
    ),
    ("whole-life PG CPU/job <= 2.0x floor", "life", "whole.cpu_us_per_job", "floor", 2.0, "le"),
    ("whole-life WAL/job <= 1.5x floor", "life", "whole.wal_bytes_per_job", "floor", 1.5, "le"),
    ("soak: jobs size last/2nd quarter <= 1.15", "soak", "size_growth", None, 1.15, "le"),
]


def targets(summary: dict[str, Any], system: str = "pgqueue") -> list[list[str]]:
    """Rows [target, measured ratio, verdict] for the targets that this run can judge."""
    rows: list[list[str]] = []
    for label, w, metric, other, threshold, op in TARGETS:
        mine = summary.get(w, {}).get(system, {}).get(metric)
        if not mine:
            continue
        value = mine["median"]
        if other is not None:
            other_sys, _, other_metric = other.partition(":")
            ref = summary.get(w, {}).get(other_sys, {}).get(other_metric or metric)
            if not ref or not ref["median"]:
                continue
            value = value / ref["median"]
        ok = value >= threshold if op == "ge" else value <= threshold
        miss = "" if ok else f" (by {abs(value - threshold) / threshold:.0%})"
        rows.append([label, f"{value:.2f}", "met" if ok else "MISSED" + miss])
    return rows
