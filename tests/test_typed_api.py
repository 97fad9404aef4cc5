"""pgqueue ships py.typed: a user's project that uses the public API
type-checks under ``mypy --strict`` (examples/typed_usage.py, checked as a
separate project that finds pgqueue only as an installed package)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_py_typed_is_in_the_package() -> None:
    assert (REPO / "pgqueue" / "py.typed").is_file()


def test_typed_usage_example_passes_mypy_strict(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    project = tmp_path / "user_project"
    project.mkdir()
    shutil.copy(REPO / "examples" / "typed_usage.py", project / "app.py")
    (project / "mypy.ini").write_text("[mypy]\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            "mypy.ini",
            "--cache-dir",
            str(tmp_path / "cache"),
            "app.py",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
