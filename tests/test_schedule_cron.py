"""Cron expressions and fire times (pure computation, no database, no waiting).

The fire times of pgqueue.cron are checked against a brute-force oracle that
walks every minute of a window around real DST transitions and applies the
documented rules directly.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue.cron import MAX_CATCH_UP, Cron
from pgqueue.errors import InvalidCron, InvalidTimezone

BERLIN = "Europe/Berlin"
MINUTE = timedelta(minutes=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def fires(expression: str, timezone: str, start: datetime, count: int) -> list[datetime]:
    cron = Cron.parse(expression, timezone)
    out, t = [], start
    for _ in range(count):
        t = cron.next_after(t)
        out.append(t)
    return out


def local(times: list[datetime], timezone: str = BERLIN) -> list[str]:
    return [t.astimezone(ZoneInfo(timezone)).strftime("%m-%d %H:%M:%S %Z") for t in times]


# --- DST in Europe/Berlin ------------------------------------------------------------


def test_daily_0230_on_spring_forward_fires_once_when_the_gap_ends() -> None:
    # 2024-03-31: 02:00 CET jumps to 03:00 CEST, so 02:30 never happens that day.
    got = fires("30 2 * * *", BERLIN, utc(2024, 3, 30, 12), 3)
    assert got == [utc(2024, 3, 31, 1, 0), utc(2024, 4, 1, 0, 30), utc(2024, 4, 2, 0, 30)]
    assert local(got) == ["03-31 03:00:00 CEST", "04-01 02:30:00 CEST", "04-02 02:30:00 CEST"]


def test_daily_0230_on_fall_back_fires_once_at_the_first_occurrence() -> None:
    # 2024-10-27: 03:00 CEST goes back to 02:00 CET, so 02:30 happens twice.
    got = fires("30 2 * * *", BERLIN, utc(2024, 10, 26, 12), 3)
    assert got == [utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30), utc(2024, 10, 29, 1, 30)]
    assert local(got) == ["10-27 02:30:00 CEST", "10-28 02:30:00 CET", "10-29 02:30:00 CET"]


def test_hourly_fires_every_real_hour_across_both_transitions() -> None:
    spring = fires("0 * * * *", BERLIN, utc(2024, 3, 30, 23, 0), 3)
    assert local(spring) == ["03-31 01:00:00 CET", "03-31 03:00:00 CEST", "03-31 04:00:00 CEST"]
    assert [b - a for a, b in itertools.pairwise(spring)] == [timedelta(hours=1)] * 2
    autumn = fires("0 * * * *", BERLIN, utc(2024, 10, 26, 23, 30), 4)
    assert local(autumn) == [
        "10-27 02:00:00 CEST",
        "10-27 02:00:00 CET",  # the repeated hour is a real hour
        "10-27 03:00:00 CET",
        "10-27 04:00:00 CET",
    ]
    assert [b - a for a, b in itertools.pairwise(autumn)] == [timedelta(hours=1)] * 3


def test_fixed_hours_fire_once_each_on_fall_back() -> None:
    got = fires("0 1-3 * * *", BERLIN, utc(2024, 10, 26, 12), 4)
    assert local(got) == [
        "10-27 01:00:00 CEST",
        "10-27 02:00:00 CEST",
        "10-27 03:00:00 CET",
        "10-28 01:00:00 CET",
    ]


def test_every_second_runs_through_the_repeated_hour_without_gaps_or_repeats() -> None:
    got = fires("* * * * * *", BERLIN, utc(2024, 10, 27, 0, 59, 58), 4)
    assert got == [utc(2024, 10, 27, 0, 59, 59) + timedelta(seconds=i) for i in range(4)]


def test_a_day_with_23_hours_and_one_with_25() -> None:
    cron = Cron.parse("0 * * * *", BERLIN)
    day = ZoneInfo(BERLIN)
    for date, hours in ((datetime(2024, 3, 31), 23), (datetime(2024, 10, 27), 25)):
        start = date.replace(tzinfo=day).astimezone(UTC) - timedelta(seconds=1)
        end = (date + timedelta(days=1)).replace(tzinfo=day).astimezone(UTC)
        count, t = 0, cron.next_after(start)
        while t < end:
            count, t = count + 1, cron.next_after(t)
        assert count == hours


# --- against a brute-force oracle -------------------------------------------------------


def oracle(expression: str, timezone: str, start: datetime, end: datetime) -> list[datetime]:
    """Fire times in (start, end] of a 5-field expression, minute by minute."""
    tz = ZoneInfo(timezone)
    hours = croniter(expression).expanded[1]
    every_hour = hours == ["*"] or len(hours) == 24
    # Matching wall times (naive) around the window, straight from croniter.
    walls, wall = set(), (start - timedelta(days=2)).replace(tzinfo=None)
    matching = croniter(expression, wall)
    while wall <= (end + timedelta(days=2)).replace(tzinfo=None):
        wall = matching.get_next(datetime)
        walls.add(wall)
    out: set[datetime] = set()
    x = start.replace(second=0, microsecond=0) + MINUTE
    while x <= end:
        here, before = x.astimezone(tz), (x - MINUTE).astimezone(tz)
        wall = here.replace(tzinfo=None)
        if wall in walls and (not here.fold or every_hour):
            out.add(x)
        skipped = wall - before.replace(tzinfo=None) - MINUTE
        if skipped > timedelta(0):  # the clocks jumped forward at x
            gap = before.replace(tzinfo=None) + MINUTE
            if any(gap + i * MINUTE in walls for i in range(skipped // MINUTE)):
                out.add(x)
        x += MINUTE
    return sorted(out)


def computed(expression: str, timezone: str, start: datetime, end: datetime) -> list[datetime]:
    cron, out, t = Cron.parse(expression, timezone), [], start
    while (t := cron.next_after(t)) <= end:
        out.append(t)
    return out


TRANSITIONS = [
    (BERLIN, utc(2024, 3, 30, 12)),
    (BERLIN, utc(2024, 10, 26, 12)),
    ("America/New_York", utc(2024, 3, 9, 18)),
    ("America/New_York", utc(2024, 11, 2, 18)),
    ("Australia/Lord_Howe", utc(2024, 4, 6, 2)),  # back by 30 minutes
    ("Australia/Lord_Howe", utc(2024, 10, 5, 2)),  # forward by 30 minutes
    ("America/Sao_Paulo", utc(2018, 11, 3, 12)),  # midnight does not exist
    ("Pacific/Apia", utc(2011, 12, 29, 0)),  # 2011-12-30 does not exist at all
    ("UTC", utc(2024, 2, 28, 12)),
]
EXPRESSIONS = [
    "30 2 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "0 0 * * *",
    "45 1-3 * * *",
    "0 12 * * *",
    "*/7 2 * * *",
    "0,30 * * * 0",
]


@pytest.mark.parametrize(("timezone", "start"), TRANSITIONS)
@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_fire_times_equal_the_oracle_around_transitions(
    expression: str, timezone: str, start: datetime
) -> None:
    end = start + timedelta(days=2)
    assert computed(expression, timezone, start, end) == oracle(expression, timezone, start, end)


FIELD = st.one_of(
    st.just("*"),
    st.integers(0, 23).map(str),
    st.tuples(st.integers(0, 11), st.integers(12, 23)).map(lambda p: f"{p[0]}-{p[1]}"),
    st.integers(1, 20).map(lambda n: f"*/{n}"),
    st.lists(st.integers(0, 23), min_size=1, max_size=3).map(lambda v: ",".join(map(str, v))),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    minute=FIELD,
    hour=FIELD,
    timezone=st.sampled_from([t for t, _ in TRANSITIONS]),
    start=st.sampled_from([s for _, s in TRANSITIONS]),
)
def test_generated_expressions_equal_the_oracle(
    minute: str, hour: str, timezone: str, start: datetime
) -> None:
    expression = f"{minute} {hour} * * *"
    end = start + timedelta(days=1)
    assert computed(expression, timezone, start, end) == oracle(expression, timezone, start, end)


# --- latest_between and the late / missed policy --------------------------------------------


def test_latest_between_is_the_last_fire_time_in_the_range() -> None:
    cron = Cron.parse("0 0 1 * *")
    assert cron.latest_between(utc(2020, 1, 1), utc(2024, 5, 3)) == utc(2024, 5, 1)
    every_second = Cron.parse("* * * * * *")
    high = utc(2024, 1, 3, 5, 6, 7) + timedelta(microseconds=500)
    assert every_second.latest_between(utc(2024, 1, 1), high) == utc(2024, 1, 3, 5, 6, 7)
    assert every_second.latest_between(utc(2024, 1, 1), utc(2024, 1, 1)) == utc(2024, 1, 1)


def test_missed_slots_fire_once_as_the_latest() -> None:
    cron = Cron.parse("*/5 * * * *")
    times, following = cron.plan(utc(2024, 1, 1, 0, 5), utc(2024, 1, 1, 3, 2), None)
    assert times == [utc(2024, 1, 1, 3, 0)]
    assert following == utc(2024, 1, 1, 3, 5)


def test_slots_a_running_scheduler_was_late_for_fire_one_by_one() -> None:
    cron = Cron.parse("* * * * * *")
    t0 = utc(2024, 1, 1)
    times, following = cron.plan(t0, t0 + timedelta(seconds=3.5), t0 - timedelta(seconds=0.2))
    assert times == [t0 + timedelta(seconds=i) for i in range(4)]
    assert following == t0 + timedelta(seconds=4)


def test_missed_before_the_scheduler_looked_collapse_then_late_ones_fire() -> None:
    cron = Cron.parse("* * * * * *")
    t0 = utc(2024, 1, 1)
    times, _ = cron.plan(t0, t0 + timedelta(seconds=10.5), t0 + timedelta(seconds=8.2))
    assert times == [t0 + timedelta(seconds=s) for s in (8, 9, 10)]


def test_a_huge_backlog_collapses_even_for_a_running_scheduler() -> None:
    cron = Cron.parse("* * * * * *")
    t0 = utc(2024, 1, 1)
    now = t0 + timedelta(seconds=MAX_CATCH_UP + 50)
    assert cron.plan(t0, now, t0 - timedelta(seconds=1))[0] == [now]


def test_nothing_fires_before_it_is_due() -> None:
    cron = Cron.parse("0 * * * *")
    assert cron.plan(utc(2024, 1, 1, 1), utc(2024, 1, 1, 0, 59, 59), None) == (
        [],
        utc(2024, 1, 1, 1),
    )


# --- validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "* * * *",
        "* * * * * * *",  # croniter's year field is not part of the contract
        "61 * * * *",
        "* 24 * * *",
        "*/0 * * * *",
        "0 0 30 2 *",  # never fires
        "0 0 31 4 *",
        "H * * * *",
        "@reboot",
        "1-2-3 * * * *",
        "mon * * * *",
        None,
        5,
    ],
)
def test_invalid_cron_is_rejected_with_its_reason(expression: object) -> None:
    with pytest.raises(InvalidCron, match="cron expression"):
        Cron.parse(expression)


@pytest.mark.parametrize(
    "expression",
    ["*/5 * * * *", "  0   3 * * 1-5 ", "* * * * * */10", "@daily", "@hourly", "0 0 29 2 *"],
)
def test_valid_cron_is_normalized(expression: str) -> None:
    cron = Cron.parse(expression)
    assert cron.expression == " ".join(expression.split())
    assert cron.next_after(utc(2024, 1, 1)) > utc(2024, 1, 1)


def test_the_sixth_field_is_seconds() -> None:
    assert fires("* * * * * */10", "UTC", utc(2024, 1, 1), 3) == [
        utc(2024, 1, 1, 0, 0, 10),
        utc(2024, 1, 1, 0, 0, 20),
        utc(2024, 1, 1, 0, 0, 30),
    ]


@pytest.mark.parametrize("timezone", ["Mars/Olympus", "", "../../etc/passwd", "/etc/localtime", 3])
def test_unknown_time_zone_is_rejected(timezone: object) -> None:
    with pytest.raises(InvalidTimezone, match="time zone"):
        Cron.parse("* * * * *", timezone)


CRON_ALPHABET = "0123456789*/,-? LW#@abcdefhijlmnorstuwyHJFMASOND\t"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=30), st.text(alphabet=CRON_ALPHABET, max_size=30)))
def test_any_string_is_valid_or_invalid_cron_never_another_error(text: str) -> None:
    try:
        cron = Cron.parse(text, BERLIN)
    except InvalidCron:
        return
    start = utc(2024, 10, 26, 23, 59)
    first = cron.next_after(start)
    assert first > start
    assert cron.next_after(first) > first


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_any_time_zone_string_is_known_or_invalid(text: str) -> None:
    try:
        Cron.parse("* * * * *", text)
    except InvalidTimezone:
        pass  # the one error allowed; any other exception fails the test
