"""Testing helpers for applications, against a real PostgreSQL.

>>> from pgqueue.testing import assert_enqueued, drain, perform
>>> checkout.enqueue(order_id=42)                        # doctest: +SKIP
>>> assert_enqueued(app, checkout, payload={"order_id": 42})   # doctest: +SKIP
>>> drain(app)                                            # doctest: +SKIP
DrainResult(succeeded=2, failed=0, dead=0, cancelled=0, snoozed=0, slept=0, waited=0)

The pytest plugin (entry point ``pgqueue``) adds the fixtures
``pgqueue_dsn`` and ``pgqueue_isolated``; see :mod:`pgqueue_pytest`.
"""

from pgqueue.testing.assertions import assert_enqueued, enqueued_jobs, refute_enqueued
from pgqueue.testing.drain import DrainResult, drain, drain_async
from pgqueue.testing.isolation import isolated
from pgqueue.testing.perform import perform, perform_async

__all__ = [
    "DrainResult",
    "assert_enqueued",
    "drain",
    "drain_async",
    "enqueued_jobs",
    "isolated",
    "perform",
    "perform_async",
    "refute_enqueued",
]
