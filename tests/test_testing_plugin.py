"""The pytest plugin (entry point ``pgqueue``) and the example that uses it,
each in a pytest run of its own, as an application's test suite runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "testing_app"


def _pytest(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGQUEUE_", "PYTEST_"))}
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


def test_the_example_app_tests_pass_and_leave_no_schema_behind(db_dsn: str) -> None:
    run = _pytest(["test_orders.py"], EXAMPLE, _env(PGQUEUE_TEST_DSN=db_dsn))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 passed" in run.stdout
    with psycopg.connect(db_dsn) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgqueue_test%'"
        ).fetchall()
    assert left == []


def test_the_plugin_loads_in_every_run_without_importing_pgqueue(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text(
        "import sys\n"
        "def test_plugin(pytestconfig):\n"
        "    assert pytestconfig.pluginmanager.has_plugin('pgqueue')\n"
        "    assert [m for m in sys.modules if m.split('.')[0] == 'pgqueue'] == []\n"
    )
    run = _pytest(["--fixtures", "test_unrelated.py"], tmp_path, _env())
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pgqueue_dsn [session scope]" in run.stdout
    assert "pgqueue_isolated" in run.stdout
    run = _pytest(["test_unrelated.py"], tmp_path, _env())
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
