"""Running the ``pgqueue`` command in tests: the installed console script as a
subprocess (what operators and cron run), or Typer's CliRunner in-process
(fast, for edge cases). Plus small SQL helpers to compare output with the
database."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner, Result

#: Every subprocess is bounded: a hang fails the test instead of the suite.
COMMAND_TIMEOUT = 120.0

# Settings that would point the command at another database or schema than the test's.
_LEAKY_ENV = ("PGQUEUE_DSN", "DATABASE_URL", "PGQUEUE_SCHEMA", "PGQUEUE_APP")


def script() -> str:
    """The ``pgqueue`` console script installed next to this interpreter."""
    found = shutil.which("pgqueue", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"no pgqueue console script next to {sys.executable}: pip install -e .")
    return found


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _LEAKY_ENV}


def run_cli(
    dsn: str | None,
    *args: str,
    input: str | None = None,
    executable: str | None = None,
    timeout: float = COMMAND_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """Run ``pgqueue [--dsn DSN] ARGS...`` and wait for it (bounded)."""
    command = [executable or script(), *(["--dsn", dsn] if dsn is not None else []), *args]
    return subprocess.run(
        command,
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        check=False,
    )


def start_cli(dsn: str, *args: str) -> subprocess.Popen[str]:
    """Start ``pgqueue --dsn DSN ARGS...`` without waiting (for concurrency and crash tests)."""
    return subprocess.Popen(
        [script(), "--dsn", dsn, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )


def run_json(dsn: str, *args: str, input: str | None = None) -> Any:
    """Run a command with ``--json`` appended; assert success and parse stdout."""
    done = run_cli(dsn, *args, "--json", input=input)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def invoke(dsn: str | None, *args: str, input: str | None = None) -> Result:
    """Run the command in-process with Typer's CliRunner."""
    from pgqueue_cli.main import app

    argv = [*(["--dsn", dsn] if dsn is not None else []), *args]
    return CliRunner(env=dict.fromkeys(_LEAKY_ENV)).invoke(app, argv, input=input)


def assert_one_line_error(
    result: Result | subprocess.CompletedProcess[str], *fragments: str
) -> None:
    """Exit code 1, nothing on stdout, one ``error: ...`` line on stderr naming the problem."""
    code = result.exit_code if isinstance(result, Result) else result.returncode
    assert code == 1, f"exit {code}: stdout={result.stdout!r} stderr={result.stderr!r}"
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """All rows of a query, on a short autocommit connection."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def value(dsn: str, query: str, params: Any = None) -> Any:
    """The single value of a one-row, one-column query."""
    (row,) = rows(dsn, query, params)
    return row[0]
