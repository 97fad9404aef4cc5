"""CPU time of the server and the worker processes, read from /proc.

A Postgres queue's cost per job is steadier than its rate on a shared
machine: rates swing 30-60 % between runs, CPU per job about 10 %. The
server's share is the postmaster's process tree: every live child's
utime+stime, plus the postmaster's cutime+cstime, where backends that exited
meanwhile were accounted when it reaped them. Only this server's processes
count (found through its postmaster.pid), not another cluster on the machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: split after its closing parenthesis
    return text[text.rindex(")") + 2 :].split()


def process_seconds(pid: int, *, children: bool = False) -> float:
    """utime+stime of ``pid`` (and cutime+cstime of its reaped children), in seconds."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    # after the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def postmaster_pid(conn: psycopg.Connection[Any]) -> int | None:
    """The server's postmaster pid, when its data directory is readable here."""
    row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    try:
        return int(Path(row[0], "postmaster.pid").read_text().split()[0]) if row else None
    except (OSError, ValueError, PermissionError):
        return None


def server_seconds(postmaster: int) -> float:
    """CPU seconds of the server: its live processes plus the backends it reaped."""
    total = process_seconds(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def tree_seconds(pids: list[int]) -> float:
    """CPU seconds of these processes and of their reaped children."""
    return sum(process_seconds(pid, children=True) for pid in pids)


def snapshot(postmaster: int | None, worker_pids: list[int]) -> tuple[float | None, float]:
    """(server seconds or None when its processes are not visible, workers' seconds)."""
    return (server_seconds(postmaster) if postmaster else None, tree_seconds(worker_pids))


def per_job_us(
    before: tuple[float | None, float], after: tuple[float | None, float], jobs: int
) -> dict[str, float | None]:
    """CPU microseconds per job of the server and of the workers between two snapshots."""
    server = None
    if jobs and before[0] is not None and after[0] is not None:
        server = (after[0] - before[0]) * 1e6 / jobs
    return {
        "server_cpu_us_per_job": server,
        "worker_cpu_us_per_job": (after[1] - before[1]) * 1e6 / jobs if jobs else None,
    }
