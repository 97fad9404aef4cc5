"""Database errors seen by the worker's loops, counted per kind for
``pgqueue_database_errors_total{kind}``.

A plain per-process counter: the loops call :func:`count_database_error` in
their error branches, the metrics collector reads it on scrape.
"""

from __future__ import annotations

import re
from collections import Counter

DATABASE_ERRORS: Counter[str] = Counter()

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def error_kind(exc: BaseException) -> str:
    """``ConnectionFailed`` -> ``connection_failed``."""
    return _CAMEL.sub("_", type(exc).__name__).lower()


def count_database_error(exc: BaseException) -> None:
    """Count one database error a worker loop rode out."""
    DATABASE_ERRORS[error_kind(exc)] += 1
