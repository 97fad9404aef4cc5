"""Cron expressions in a time zone: validation, fire times, and what a late
scheduler fires.

croniter finds matching *wall-clock* times on naive datetimes (where it has no
DST to get wrong); this module maps them to instants in the schedule's zone
with the rules of Vixie cron for the two DST transitions:

- spring forward (wall times that never happen): a slot in the gap fires once,
  at the instant the gap ends ("30 2 * * *" in Europe/Berlin fires at 03:00
  CEST on the last Sunday of March);
- fall back (wall times that happen twice): a slot fires at its first
  occurrence only ("30 2 * * *" fires once, at 02:30 CEST), except in
  schedules whose hour field is ``*``: those run every hour, and the repeated
  hour is a real hour, so they fire in both occurrences.

Expressions have 5 fields (minute hour day month weekday) or 6, the sixth
being seconds as in croniter (``"* * * * * */10"``: every ten seconds); the
aliases ``@hourly``, ``@daily``, ``@weekly``, ``@monthly`` and ``@yearly`` work too.
Every instant returned is an aware datetime in UTC.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

from pgqueue.errors import InvalidCron, InvalidTimezone

_SECOND = timedelta(seconds=1)
_TINY = timedelta(microseconds=1)
# A fall-back transition further than this ahead cannot reorder fire times
# (real ones repeat at most a few hours); it bounds one offset comparison.
_FOLD_HORIZON = timedelta(days=1)
# Slots a late scheduler fires one by one before it treats the backlog as
# missed and fires only the latest (e.g. after the database was unreachable).
MAX_CATCH_UP = 100
_REFERENCE = datetime(2001, 1, 1)  # any date: validation only needs "can it ever fire"


def zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name``; InvalidTimezone when unknown."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidTimezone(
            f"time zone must be an IANA name such as 'Europe/Berlin', got {name!r}"
        )
    try:
        return ZoneInfo(name)
    except Exception:  # ZoneInfoNotFoundError, or ValueError for paths and odd strings
        raise InvalidTimezone(
            f"unknown time zone {name!r}: use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from None


def normalize(expression: object) -> str:
    """The expression with single spaces; InvalidCron unless it has 5 or 6
    fields (or is an @alias) and croniter accepts it."""
    if not isinstance(expression, str):
        raise InvalidCron(f"cron expression must be a string, got {type(expression).__name__}")
    fields = expression.split()
    text = " ".join(fields)
    if not (len(fields) in (5, 6) or (len(fields) == 1 and text.startswith("@"))):
        raise InvalidCron(
            f"invalid cron expression {expression!r}: it has {len(fields)} fields; use 5 "
            "(minute hour day month weekday) or 6 (the sixth is seconds)"
        )
    if not text.startswith("@"):
        for (name, low, high, names), value in zip(_FIELDS, fields, strict=False):
            if problem := _field_problem(value, low, high, names):
                raise InvalidCron(
                    f"invalid cron expression {expression!r}: {name} field {value!r}: {problem}"
                )
    try:
        croniter(text, _REFERENCE).get_next(datetime)
    except Exception as exc:  # croniter raises ValueError, KeyError, IndexError, ... on garbage
        if "failed to find next date" in str(exc):
            raise InvalidCron(
                f"invalid cron expression {expression!r}: it never fires (no month has the "
                "chosen day, e.g. 31 in February)"
            ) from None
        raise InvalidCron(
            f"invalid cron expression {expression!r}: not understood ({type(exc).__name__}); "
            "each field takes *, a number, a range a-b, a list a,b or a step */n"
        ) from None
    return text


_EXTENDED = re.compile(r"[#?]|\dL|^L", re.IGNORECASE)  # croniter's L, #, ? forms
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, lowest, highest, names counted from lowest) of the 5 fields, then seconds.
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
    ("second", 0, 59, ()),
)


def _field_problem(value: str, low: int, high: int, names: tuple[str, ...]) -> str | None:
    """What is wrong with one field, in words; None when it looks right.
    Forms croniter adds (L, W, #, ?) are left to it."""
    if _EXTENDED.search(value) or (not names and any(m in value.upper() for m in "LW")):
        return None
    for item in value.split(","):
        if not item:
            return "an empty item in a list (two commas, or a trailing comma)"
        base, slash, step = item.partition("/")
        if slash and (not step.isdigit() or int(step) == 0):
            return f"step {step!r} must be a whole number of at least 1"
        if base == "*":
            continue
        bounds = []
        for part in base.split("-", 1):
            number = _number(part, low, names)
            if number is None:
                allowed = f" or a name ({names[0]}..{names[-1]})" if names else ""
                return f"{part!r} is not a number{allowed}"
            if not low <= number <= high:
                return f"{number} is out of range {low}-{high}"
            bounds.append(number)
        if len(bounds) == 2 and bounds[0] > bounds[1]:
            return f"range {base!r} goes backwards"
    return None


def _number(text: str, low: int, names: tuple[str, ...]) -> int | None:
    if text.isdigit():
        return int(text)
    if text.lower() in names:
        return names.index(text.lower()) + low
    return None


@dataclass(frozen=True, slots=True)
class Cron:
    """A validated cron expression in a time zone; see the module docstring."""

    expression: str
    timezone: str
    tz: ZoneInfo = field(repr=False, compare=False)
    every_hour: bool = field(repr=False, compare=False)

    @classmethod
    def parse(cls, expression: object, timezone: object = "UTC") -> Cron:
        """Validate both; raises InvalidCron or InvalidTimezone."""
        text = normalize(expression)
        tz = zone(timezone)
        hours = croniter(text, _REFERENCE).expanded[1]
        return cls(text, str(timezone), tz, hours == ["*"] or len(hours) == 24)

    # --- fire times ---------------------------------------------------------

    def next_after(self, t: datetime) -> datetime:
        """The first fire time strictly after ``t`` (aware; naive means UTC)."""
        t = _utc(t)
        local = t.astimezone(self.tz)
        wall = local.replace(tzinfo=None)
        if local.fold:
            # t is in the second occurrence of a repeated hour: every wall time
            # up to the end of that hour already had its first occurrence.
            _, repeat_end = self._repeated_walls(t - _shift(local), t)
            first = self._first_occurrence_after(repeat_end - _SECOND, t)
            if self.every_hour and (w := self._wall_after(wall)) < repeat_end:
                return min(first, self._second_occurrence(w))
            return first
        first = self._first_occurrence_after(wall, t)
        if self.every_hour and (again := self._repeat_before(t, first)) is not None:
            return again
        return first

    def latest_between(self, low: datetime, high: datetime) -> datetime:
        """The last fire time in [low, high] (``low`` itself when none is):
        a binary search over whole seconds, fast for any span."""
        low, high = _utc(low), _utc(high)
        lo, hi = 0, max(0, math.floor((high - low).total_seconds()))
        # Invariant: a fire time >= low + lo seconds exists in range; none >= low + hi + 1.
        if self.next_after(low - _TINY) > high:
            return low
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.next_after(low + mid * _SECOND - _TINY) <= high:
                lo = mid
            else:
                hi = mid - 1
        return self.next_after(low + lo * _SECOND - _TINY)

    def plan(
        self, due_at: datetime, now: datetime, watched_since: datetime | None
    ) -> tuple[list[datetime], datetime]:
        """What a scheduler fires at ``now`` for a schedule due at ``due_at``
        (its earliest unfired slot): the fire times, oldest first, and the
        next fire time after them.

        Slots that came due after ``watched_since`` (when this scheduler last
        looked, None if it just started) fire one by one, so a late scheduler
        loses none. Older ones were missed while no scheduler ran: they fire
        once, as the latest of them.
        """
        due_at, now = _utc(due_at), _utc(now)
        if due_at > now:
            return [], due_at
        following = self.next_after(now)
        cut = now if watched_since is None else min(_utc(watched_since), now)
        times = [self.latest_between(due_at, cut)] if due_at <= cut else []
        slot = due_at if due_at > cut else self.next_after(cut)
        while slot <= now:
            if len(times) >= MAX_CATCH_UP:
                return [self.latest_between(due_at, now)], following
            times.append(slot)
            slot = self.next_after(slot)
        return times, following

    # --- wall times to instants -----------------------------------------------

    def _wall_after(self, wall: datetime) -> datetime:
        result: datetime = croniter(self.expression, wall).get_next(datetime)
        return result

    def _first_occurrence_after(self, wall: datetime, t: datetime) -> datetime:
        """The first-occurrence instant of the earliest matching wall time after
        ``wall`` that lies after ``t``. First occurrences never decrease as wall
        times increase, so the walk ends at the first hit."""
        walls = croniter(self.expression, wall)
        while True:
            instant = self._first_occurrence(walls.get_next(datetime))
            if instant > t:
                return instant

    def _first_occurrence(self, wall: datetime) -> datetime:
        """The instant of a wall time; its first one when it happens twice,
        the end of the gap when it never happens."""
        first = wall.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        if first.astimezone(self.tz).replace(tzinfo=None) == wall:
            return first
        other = wall.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
        return self._transition(min(first, other), max(first, other))

    def _repeat_before(self, t: datetime, limit: datetime) -> datetime | None:
        """For every-hour schedules: a second occurrence of a repeated wall time
        after ``t`` and before ``limit``, when a fall-back lies in between."""
        end = min(limit, t + _FOLD_HORIZON)
        if _offset(end, self.tz) >= _offset(t, self.tz):
            return None
        repeat_start, repeat_end = self._repeated_walls(t, end)
        w = self._wall_after(repeat_start - _SECOND)
        if w >= repeat_end:
            return None
        second = self._second_occurrence(w)  # after t: the clocks went back after t
        return second if second < limit else None

    def _repeated_walls(self, before: datetime, after: datetime) -> tuple[datetime, datetime]:
        """The wall times [start, end) that happen twice around the fall-back
        between instants ``before`` and ``after``."""
        change = self._transition(before, after)
        start = change.astimezone(self.tz).replace(tzinfo=None)
        return start, start + (_offset(before, self.tz) - _offset(change, self.tz))

    def _second_occurrence(self, wall: datetime) -> datetime:
        return wall.replace(tzinfo=self.tz, fold=1).astimezone(UTC)

    def _transition(self, before: datetime, after: datetime) -> datetime:
        """The first whole second in (before, after] with ``after``'s UTC offset
        (the zone changes offset once in between)."""
        target = _offset(after, self.tz)
        lo, hi = math.floor(before.timestamp()), math.ceil(after.timestamp())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _offset(datetime.fromtimestamp(mid, UTC), self.tz) == target:
                hi = mid
            else:
                lo = mid
        return datetime.fromtimestamp(hi, UTC)


def _utc(t: datetime) -> datetime:
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).astimezone(UTC)


def _offset(t: datetime, tz: ZoneInfo) -> timedelta:
    return t.astimezone(tz).utcoffset() or timedelta(0)


def _shift(local: datetime) -> timedelta:
    """How far the clocks went back for a time in a repeated hour."""
    return (local.replace(fold=0).utcoffset() or timedelta(0)) - (local.utcoffset() or timedelta(0))
