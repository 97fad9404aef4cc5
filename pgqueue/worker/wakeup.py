"""Waiting for the first of several events, with a timeout."""

from __future__ import annotations

import asyncio


async def wait_any(*events: asyncio.Event, timeout: float | None) -> None:
    """Return when any event is set or ``timeout`` seconds have passed."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


def jittered(seconds: float, spread: float = 0.1) -> float:
    """``seconds`` +/- ``spread``, so that many workers do not poll in step."""
    import random

    return seconds * (1 + spread * (2 * random.random() - 1))
