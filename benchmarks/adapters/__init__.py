"""System adapters, by command-line name."""

from __future__ import annotations

from benchmarks.adapters.base import System
from benchmarks.adapters.floor import Floor
from benchmarks.adapters.pgqueue_prev import PgQueuePrev
from benchmarks.adapters.pgqueue_sys import PgQueue, PgQueueVariant
from benchmarks.adapters.pgqueuer_sys import PgQueuerAsyncpg, PgQueuerPsycopg
from benchmarks.adapters.procrastinate_sys import Procrastinate

SYSTEMS: dict[str, type[System]] = {
    cls.name: cls
    for cls in (
        Floor,
        PgQueue,
        PgQueueVariant,
        PgQueuePrev,
        PgQueuerPsycopg,
        PgQueuerAsyncpg,
        Procrastinate,
    )
}

__all__ = ["SYSTEMS", "System"]
