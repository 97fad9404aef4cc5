"""How hints name a pgqueue command: ``pgqueue dlq requeue 9``, or
``manage.py pgqueue dlq requeue 9`` when the command line runs under
Django's ``manage.py``.

The CLI names its program, as invoked, for the duration of each invocation
(:func:`invoked_as`); outside one, hints name ``pgqueue``. Every hint of the
library that names a command is built by :func:`command`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PROGRAM", "command", "invoked_as", "program"]

#: The console script.
PROGRAM = "pgqueue"

_lock = threading.Lock()
_invoked: list[str] = []  # the programs of the invocations running, innermost last


def program() -> str:
    """The program that hints name: the running invocation's, else ``pgqueue``."""
    with _lock:
        return _invoked[-1] if _invoked else PROGRAM


def command(args: str, schema: str = "pgqueue") -> str:
    """The command line that runs ``args`` (``"dlq requeue 9"``) on ``schema``
    (``--schema`` goes before the command, as every global option)."""
    option = "" if schema == "pgqueue" else f"--schema {schema} "
    return f"{program()} {option}{args}"


@contextmanager
def invoked_as(name: str | None) -> Iterator[None]:
    """Hints name ``name`` (a CLI invocation's program) while this runs."""
    with _lock:
        _invoked.append(name or PROGRAM)
    try:
        yield
    finally:
        with _lock:
            _invoked.pop()
