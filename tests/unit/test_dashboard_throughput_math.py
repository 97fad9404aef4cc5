"""The overview's totals from canned rows: exact below the hour's cap,
an estimate with an exact lower bound past it."""

from __future__ import annotations

from typing import Any

from pgqueue.dashboard import data
from pgqueue.dashboard.data import HourTotal, throughput_op
from pgqueue.dashboard.views import chart


def drive(rows: list[dict[str, Any]]) -> data.Throughput:
    op = throughput_op()
    step = next(op)
    assert step.query == "dashboard_throughput"
    try:
        op.send(rows)
    except StopIteration as stop:
        result: data.Throughput = stop.value
        return result
    raise AssertionError("the operation asked for more than one statement")


def row(minute: int, ok: int, span: float, hour_ok: int, dead: int = 0) -> dict[str, Any]:
    return {
        "minute": minute,
        "succeeded_seen": ok,
        "succeeded_span": span,
        "dead_seen": dead,
        "dead_span": 1.0 if dead else None,
        "seconds": 60.0,
        "hour_succeeded": hour_ok,
        "hour_dead": dead,
    }


def test_a_capped_minute_does_not_make_the_hour_an_estimate() -> None:
    # 300 in the last seconds of one minute (read: the cap, 100, by second 53)
    # and 82 elsewhere: the hour's own count is exact.
    result = drive([row(0, 100, 53.3, 382), row(60, 82, 50.0, 382)])
    assert result.succeeded == HourTotal(382, 382)
    assert str(result.succeeded) == "382"
    assert result.minutes[0].succeeded_estimated
    assert not result.minutes[1].estimated
    assert chart(result)["estimated"]


def test_past_the_hour_cap_the_total_is_an_estimate_with_a_floor() -> None:
    cap = data.THROUGHPUT_HOUR_CAP
    rows = [row(i * 60, 100, 6.0, cap) for i in range(60)]  # ~1,000 a minute
    total = drive(rows).succeeded
    assert total.estimated
    assert total.at_least == cap
    assert total.value == 60 * 1000
    assert str(total) == f"≈60,000 (at least {cap:,})"


def test_an_empty_hour() -> None:
    result = drive([])
    assert result.succeeded == HourTotal(0, 0)
    assert chart(result)["peak"] == 1
