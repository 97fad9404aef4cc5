"""Bad input to the queue controls (README "Bad input"): a clear
``pgqueue.InvalidInput`` (``InvalidOption`` for limits) naming the problem,
and nothing written, whether the queue is new or already has limits."""

from __future__ import annotations

from typing import Any

import pytest

import pgqueue
from tests.cli_support import assert_one_line_error, run_cli
from tests.fixtures.dbstate import snapshot

BAD_CONCURRENCY: list[Any] = [0, -1, -(2**31), 2**31, 1.5, "2", True]
BAD_RATES: list[Any] = [
    "abc",
    "",
    "0/1s",
    "-1/1s",
    "10/0s",
    "10/0",
    "10/-1s",
    "10/",
    "/1s",
    "10/1x",
    "10/1s/2",
    "1.5/1s",
    "99999999999/1s",
    10,
    (10, 1),
]


@pytest.mark.parametrize("concurrency", BAD_CONCURRENCY, ids=repr)
def test_a_bad_concurrency_limit_is_refused_and_writes_nothing(
    app: pgqueue.App, db_dsn: str, concurrency: Any
) -> None:
    app.set_queue_limit("q", concurrency=3, rate="5/1m")
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.InvalidOption, match="concurrency"):
        app.set_queue_limit("q", concurrency=concurrency)
    with pytest.raises(pgqueue.InvalidOption, match="concurrency"):
        app.set_queue_limit("new-queue", concurrency=concurrency)

    assert snapshot(db_dsn) == before
    metrics = app.metrics()
    assert (metrics["q"].concurrency_limit, metrics["q"].rate_limit) == (3, "5/1m")
    assert "new-queue" not in metrics


@pytest.mark.parametrize("rate", BAD_RATES, ids=repr)
def test_a_bad_rate_limit_is_refused_and_writes_nothing(
    app: pgqueue.App, db_dsn: str, rate: Any
) -> None:
    app.set_queue_limit("q", concurrency=3, rate="5/1m")
    before = snapshot(db_dsn)

    with pytest.raises(pgqueue.InvalidInput) as refused:
        app.set_queue_limit("q", concurrency=4, rate=rate)
    with pytest.raises(pgqueue.InvalidInput):
        app.set_queue_limit("new-queue", rate=rate)

    assert isinstance(refused.value, ValueError | TypeError)
    message = str(refused.value)
    assert "rate" in message or repr(rate) in message or "duration" in message, message
    assert snapshot(db_dsn) == before
    assert app.metrics()["q"].concurrency_limit == 3


@pytest.mark.parametrize("rate", ["1/999999999999d", "1/1000000000000000000000s"])
def test_an_absurdly_long_rate_period_is_refused_as_bad_input(
    app: pgqueue.App, db_dsn: str, rate: str
) -> None:
    before = snapshot(db_dsn)
    with pytest.raises(pgqueue.InvalidInput):
        app.set_queue_limit("q", rate=rate)
    assert snapshot(db_dsn) == before


@pytest.mark.parametrize("name", ["", "has space", "x" * 129, "semi;colon"])
def test_queue_controls_refuse_a_bad_queue_name(app: pgqueue.App, db_dsn: str, name: str) -> None:
    before = snapshot(db_dsn)
    with pytest.raises(pgqueue.InvalidName):
        app.pause_queue(name)
    with pytest.raises(pgqueue.InvalidName):
        app.resume_queue(name)
    with pytest.raises(pgqueue.InvalidName):
        app.set_queue_limit(name, concurrency=1)
    assert snapshot(db_dsn) == before


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--concurrency", "0"], "concurrency"),
        (["--concurrency", "-3"], "concurrency"),
        (["--rate", "abc"], "rate"),
        (["--rate", "0/1s"], "rate"),
        (["--rate", "10/0s"], "rate"),
    ],
)
def test_cli_queue_limit_refuses_bad_limits_in_one_line(
    db_dsn: str, app: pgqueue.App, options: list[str], fragment: str
) -> None:
    app.set_queue_limit("q", concurrency=3)
    before = snapshot(db_dsn)

    refused = run_cli(db_dsn, "queue", "limit", "q", *options)

    assert_one_line_error(refused, fragment)
    assert snapshot(db_dsn) == before


def test_cli_queue_limit_refuses_an_absurd_rate_period_in_one_line(
    db_dsn: str, app: pgqueue.App
) -> None:
    app.set_queue_limit("q", concurrency=3)
    before = snapshot(db_dsn)

    refused = run_cli(db_dsn, "queue", "limit", "q", "--rate", "1/999999999999d")

    assert snapshot(db_dsn) == before
    assert_one_line_error(refused, "rate")
