"""Smoke test of ``python -m benchmarks.statements`` (the per-statement
breakdown): it starts its own throwaway cluster, so it needs the PostgreSQL
server binaries (``pg_config --bindir``) and, as root, the ``postgres`` user."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.workers import REPO_ROOT


def _cannot_run() -> str | None:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return "pg_config not found"
    bindir = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout
    if not (Path(bindir.strip()) / "initdb").exists():
        return "no PostgreSQL server binaries (initdb) next to pg_config"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a postgres OS user"
        if shutil.which("runuser") is None:
            return "running as root without runuser"
    return None


pytestmark = pytest.mark.skipif(_cannot_run() is not None, reason=str(_cannot_run()))


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("pgqb-statements-*")}


def test_statements_breakdown_of_a_small_run() -> None:
    before = _leftovers()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.statements", "--jobs", "300", "--top", "50", "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["track"] == "all"
    enqueue, drain = report["phases"]["enqueue"], report["phases"]["drain"]
    texts = {
        phase: " ".join(s["query"] for s in report["phases"][phase]["statements"])
        for phase in ("enqueue", "drain")
    }
    # the bulk enqueue of jobs that differ only in their payload (0012)
    assert "enqueue_payloads" in texts["enqueue"]
    assert "lease_jobs" in texts["drain"]
    assert "ack_jobs" in texts["drain"]
    # Nested statements (inside plpgsql) are counted, the tool's own polling is not.
    assert any(s["level"] == "nested" for s in drain["statements"])
    assert "pgqb-statements-monitor" not in texts["drain"] + texts["enqueue"]
    # Every job went through: the lease and the completions returned 300 rows.
    leased = sum(s["rows"] for s in drain["statements"] if "lease_jobs(" in s["query"])
    assert leased == 300
    # (enqueue_payloads returns the new ids as one array: one row per call)
    assert enqueue["jobs"] == 300
    assert enqueue["totals"]["rows"] >= 1
    assert drain["totals"]["wal_bytes"] > 0
    # The cluster is stopped and its directory removed.
    assert _leftovers() == before
