"""Write the sync twin of each async source module (psycopg's approach).

The async code is the one source: ``pgqueue/app_async.py`` (App's
operations) and ``pgqueue/driver_async.py`` (the driver under them). This
script turns each into its sync module with a fixed list of textual rules, then
formats it with ruff, so signatures stay explicit for IDEs and ``mypy --strict``
and the two can never drift::

    python tools/async_to_sync.py          # rewrite the sync modules
    python tools/async_to_sync.py --check  # exit 1 when one is stale (CI)

Rules, in order (nothing else changes, comments and docstrings included):

- ``async def``/``async with``/``async for`` lose ``async``; ``await`` goes.
- a name ending in ``_async`` loses it (``run_async`` -> ``run``);
  ``async_connection`` -> ``sync_connection``;
- ``Async`` goes from a CamelCase name (``psycopg.AsyncConnection`` ->
  ``psycopg.Connection``, ``AsyncAppOperations`` -> ``AppOperations``);
- ``asynccontextmanager`` -> ``contextmanager``, ``asyncio.sleep`` ->
  ``time.sleep`` (and ``import asyncio`` -> ``import time``).

What cannot follow these rules (the pools, ``App.close``) is written by hand
outside the async sources.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: async source -> generated sync module
MODULES = {
    ROOT / "pgqueue" / "driver_async.py": ROOT / "pgqueue" / "driver_sync.py",
    ROOT / "pgqueue" / "app_async.py": ROOT / "pgqueue" / "app_sync.py",
}

_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\basync (def|with|for)\b"), r"\1"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\basync_connection\b"), "sync_connection"),
    (re.compile(r"\b(\w+?)_async\b"), r"\1"),
    (re.compile(r"\basynccontextmanager\b"), "contextmanager"),
    (re.compile(r"\basyncio\.sleep\b"), "time.sleep"),
    (re.compile(r"^import asyncio$", re.M), "import time"),
    (re.compile(r"\b(\w*?)Async([A-Z]\w*)"), r"\1\2"),
]


def header(source: Path) -> str:
    rel = source.relative_to(ROOT).as_posix()
    return (
        f"# Generated from {rel} by tools/async_to_sync.py: do not edit.\n"
        f"# Change {rel}, then run `python tools/async_to_sync.py`.\n"
    )


def convert(text: str) -> str:
    """The sync text of one async module, before formatting."""
    out = text
    for pattern, replacement in _RULES:
        out = pattern.sub(replacement, out)
    return out


def _ruff(args: list[str], text: str, target: Path) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            *args,
            "--config",
            str(ROOT / "pyproject.toml"),
            "--stdin-filename",
            str(target),
            "-",
        ],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode not in (0, 1) or not done.stdout:
        raise SystemExit(f"ruff {' '.join(args)} failed on {target.name}: {done.stderr}")
    return done.stdout


def generate(source: Path, target: Path) -> str:
    """The formatted sync module for ``source``."""
    text = header(source) + convert(source.read_text())
    # isort and unused imports first (the renames move and drop names), then format.
    text = _ruff(["check", "--fix", "--select", "I,F401", "--quiet", "--exit-zero"], text, target)
    return _ruff(["format", "--quiet"], text, target)


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a module is stale")
    check = parser.parse_args(argv).check
    stale = []
    for source, target in MODULES.items():
        text = generate(source, target)
        if target.exists() and target.read_text() == text:
            continue
        if check:
            stale.append(_shown(target))
        else:
            target.write_text(text)
            print(f"wrote {_shown(target)}")
    if stale:
        print(f"stale: {', '.join(stale)}: run `python tools/async_to_sync.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
