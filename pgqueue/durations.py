"""Parsing of durations (``30s``, ``15m``, ``7d``, ``1h30m``, ISO-8601 ``PT1H30M``,
``P7D``) and times (ISO-8601): the one parser behind every duration option of
the CLI and every duration argument of the Python API.

Text needs a unit: ``"30"`` is refused, since ``--older-than 30`` could mean
seconds or days and guessing wrong deletes data. Numbers (Python ``int`` or
``float``) are seconds, as the Python API documents.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from pgqueue.errors import InvalidDuration

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SHORT = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
#: The longest duration accepted: a cutoff or delay beyond it is surely a typo,
#: and PostgreSQL's or Python's time arithmetic would overflow on some.
MAX_DURATION = timedelta(days=36500)
_HINT = "use e.g. 30s, 15m, 2h, 7d, 1h30m or ISO-8601 PT15M"
_ISO = re.compile(
    r"^P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(text: str | float | timedelta) -> timedelta:
    """A non-negative duration from ``"30s"``, ``"1h30m"``, ``"PT15M"``, seconds
    (a number) or a timedelta; at most :data:`MAX_DURATION`."""
    if isinstance(text, timedelta):
        value = text
    elif isinstance(text, int | float) and not isinstance(text, bool):
        if not math.isfinite(text):
            raise InvalidDuration(f"not a usable duration: {text!r}")
        try:
            value = timedelta(seconds=text)
        except (OverflowError, ValueError):
            raise _too_long(text) from None
    elif isinstance(text, str):
        try:
            value = _parse_text(text.strip())
        except OverflowError:
            raise _too_long(text) from None
    else:
        raise InvalidDuration(f"not a duration: {text!r}")
    if value < timedelta(0):
        raise InvalidDuration(f"duration must not be negative: {text!r}")
    if value > MAX_DURATION:
        raise _too_long(text)
    return value


def _too_long(text: object) -> InvalidDuration:
    return InvalidDuration(f"duration too long: {text!r} (at most 36500d, about 100 years)")


def _parse_text(text: str) -> timedelta:
    if not text:
        raise InvalidDuration("empty duration")
    upper = text.upper()
    if upper.startswith("P"):
        m = _ISO.match(upper)
        if not m or upper in ("P", "PT") or upper.endswith("T"):
            raise InvalidDuration(f"not an ISO-8601 duration: {text!r} (e.g. PT15M, P7D)")
        parts = {k: float(v) for k, v in m.groupdict().items() if v}
        return timedelta(
            weeks=parts.get("w", 0),
            days=parts.get("d", 0),
            hours=parts.get("h", 0),
            minutes=parts.get("m", 0),
            seconds=parts.get("s", 0),
        )
    if re.fullmatch(r"[-+]?\d+(\.\d+)?", text):
        raise InvalidDuration(
            f"duration {text!r} needs a unit, e.g. {text}s, {text}m, {text}h or {text}d "
            "(a bare number is ambiguous)"
        )
    pos, total = 0, 0.0
    for m in _SHORT.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise InvalidDuration(f"not a duration: {text!r} ({_HINT})")
    return timedelta(seconds=total)


def parse_time(text: str | datetime) -> datetime:
    """An aware datetime from ISO-8601 text; a time without zone is taken as UTC."""
    if isinstance(text, datetime):
        value = text
    else:
        try:
            value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidDuration(
                f"not an ISO-8601 time: {text!r} (e.g. 2026-12-24T18:00:00+01:00)"
            ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
