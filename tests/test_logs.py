"""``configure_logging`` (what ``pgqueue worker`` and the CLI set up) beside
the host application's own logging: a host that configured logging keeps it,
and each record prints once. Django's default logging (``DEBUG=True``)
printed every one of its records twice next to the root handler pgqueue used
to add. Each case runs in a fresh interpreter: the logging state is global
(pytest's own handlers sit on the root logger here)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_SETUP = {
    # The application put a handler on the root logger.
    "root": """
handler = logging.StreamHandler(sys.stderr)
handler.setFormatter(logging.Formatter("HOST %(name)s %(message)s"))
logging.getLogger().addHandler(handler)
""",
    # Django's default LOGGING: handlers on "django", none on the root logger.
    "django": """
import django
from django.conf import settings
settings.configure(DEBUG=True)
django.setup()
""",
    # Nothing configured: pgqueue's root handler carries the standard library's records.
    "none": "",
}

_SCRIPT = """
import logging, sys
{setup}
from pgqueue.logs import configure_logging
configure_logging("info", "json")
configure_logging("info", "json")  # twice, as a CLI command starting a worker may
logging.getLogger("django.request").warning("django line")
logging.getLogger("psycopg.pool").warning("pool line")
"""


def _stderr(case: str) -> str:
    if case == "django":
        pytest.importorskip("django")
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(setup=_SETUP[case])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_host_root_handler_is_kept_and_prints_each_record_once() -> None:
    lines = _stderr("root").splitlines()
    assert lines == ["HOST django.request django line", "HOST psycopg.pool pool line"]


def test_django_default_logging_prints_each_record_once() -> None:
    lines = _stderr("django").splitlines()
    # Django's console handler prints its own records; psycopg's, with no
    # handler of the application's on their way, reach Python's last resort.
    assert [line for line in lines if "django line" in line] == ["django line"]
    assert [line for line in lines if "pool line" in line] == ["pool line"]


def test_without_host_logging_pgqueue_prints_the_standard_library_records_once() -> None:
    lines = _stderr("none").splitlines()
    assert lines == ["WARNING django.request: django line", "WARNING psycopg.pool: pool line"]
