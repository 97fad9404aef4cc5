"""Checks of names and options, done before anything is sent to the database."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pgqueue.durations import MAX_DURATION, parse_duration
from pgqueue.errors import InvalidDuration, InvalidName, InvalidOption, InvalidPayload

SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # also checked by the SQL enqueue()
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What Python gives for bytes that are not UTF-8 (os.fsdecode, surrogateescape,
# e.g. a command-line argument): text PostgreSQL cannot store.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
MAX_TASK_NAME = 255
# In UTF-8 bytes: a key goes into a btree index, whose entries hold at most
# ~2700 bytes (1024 characters of 3-4 bytes each would not fit).
MAX_KEY = 1024
SMALLINT = (-32768, 32767)


def schema_name(name: object) -> str:
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise InvalidName(
            f"invalid schema name {name!r}: use 1-48 characters from a-z, 0-9 and _, "
            "starting with a letter or _"
        )
    return name


def queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidName(
            f"invalid queue name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ . : -"
        )
    return name


def queue_list(queues: object) -> tuple[str, ...] | None:
    """A queue name or names, deduplicated in order; None means every queue.
    An empty list is refused: it would either mean nothing or, surprisingly,
    everything."""
    if queues is None:
        return None
    if isinstance(queues, str):
        return (queue_name(queues),)
    if not isinstance(queues, (list, tuple, set, frozenset)):
        raise InvalidName(f"queues must be a queue name, a list of names or None, got {queues!r}")
    if not queues:
        raise InvalidName("queues is empty: name at least one queue, or pass None for every queue")
    return tuple(dict.fromkeys(queue_name(q) for q in queues))


def task_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidName(f"invalid task name {name!r}: must be a non-empty string")
    if len(name) > MAX_TASK_NAME or _CONTROL.search(name):
        raise InvalidName(
            f"invalid task name {name[:80]!r}: at most {MAX_TASK_NAME} characters, "
            "no control characters"
        )
    if not unicode_text(name):
        raise InvalidName(f"invalid task name {name[:80]!r}: {NOT_UNICODE}")
    return name


NOT_UNICODE = "not valid Unicode (it holds a lone surrogate, e.g. from bytes that are not UTF-8)"


def unicode_text(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8 (holds no lone surrogate)."""
    return text.isascii() or not _SURROGATE.search(text)


def key(kind: str, value: object) -> str | None:
    """A dedup or serial key: None, or 1..1024 bytes of UTF-8 without NUL."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidOption(f"{kind} must be a non-empty string, got {value!r}")
    if not unicode_text(value):
        raise InvalidOption(f"{kind} is {NOT_UNICODE}")
    if (
        len(value) > MAX_KEY
        or (not value.isascii() and len(value.encode("utf-8")) > MAX_KEY)
        or "\x00" in value
    ):
        raise InvalidOption(f"{kind} must have at most {MAX_KEY} bytes (UTF-8) and no NUL")
    return value


MAX_GROUP_KEY = 200
_GROUP_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def group_key(value: object) -> str | None:
    """A group key: None, or 1 to 200 characters without control characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidOption(f"group_key must be a non-empty string, got {value!r}")
    if not unicode_text(value):
        raise InvalidOption(f"group_key is {NOT_UNICODE}")
    if len(value) > MAX_GROUP_KEY:
        raise InvalidOption(
            f"group_key must be at most {MAX_GROUP_KEY} characters, got {len(value)}"
        )
    if _GROUP_CONTROL.search(value):
        raise InvalidOption(f"group_key must not contain control characters, got {value!r}")
    return value


def priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"priority must be an integer, got {value!r}")
    if not SMALLINT[0] <= value <= SMALLINT[1]:
        raise InvalidOption(f"priority must be between {SMALLINT[0]} and {SMALLINT[1]}")
    return value


def positive_int(name: str, value: object, maximum: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidOption(f"{name} must be an integer from 1 to {maximum}, got {value!r}")
    return value


def max_attempts(value: object, name: str = "max_attempts") -> int:
    """A max_attempts: 0 means unlimited (retry forever), else 1 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31 - 1:
        raise InvalidOption(
            f"{name} must be an integer from 0 (unlimited) to {2**31 - 1}, got {value!r}"
        )
    return value


def seconds(name: str, value: object, *, allow_zero: bool = True) -> float:
    """Seconds from a number, a timedelta or duration text (``"5m"``, the
    parser the CLI uses); finite, not negative, at most ~100 years."""
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except InvalidDuration as exc:
            raise InvalidDuration(f"{name}: {exc}") from None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidDuration(
            f"{name} must be a number of seconds, a timedelta or text like '5m', got {value!r}"
        )
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidDuration(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    if value > MAX_DURATION.total_seconds():
        raise InvalidDuration(f"{name} is too long: {value:g}s (at most 36500d, about 100 years)")
    return float(value)


def aware(name: str, value: object) -> datetime:
    """A datetime with a time zone; naive datetimes are taken as UTC."""
    if not isinstance(value, datetime):
        raise InvalidOption(f"{name} must be a datetime, got {value!r}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


MAX_TAGS = 16
MAX_META_BYTES = 8192
_TAG = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def tags(value: object) -> list[str] | None:
    """Up to 16 distinct-or-not labels of ``[A-Za-z0-9_.:-]{1,64}``; None or empty: no tags."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
        raise InvalidOption(f"tags must be a list of strings, got {value!r}")
    out = list(value)
    if len(out) > MAX_TAGS:
        raise InvalidOption(f"tags: at most {MAX_TAGS}, got {len(out)}")
    for tag in out:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            raise InvalidOption(
                f"tags: each tag is 1 to 64 characters from A-Z a-z 0-9 _ . : -, got {tag!r}"
            )
    return out or None


def meta(value: object) -> dict[str, Any] | None:
    """A JSON object of at most 8 KiB (as compact JSON); None: no meta."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidOption(f"meta must be a JSON object (a dict), got {type(value).__name__}")
    try:
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError) as exc:
        raise InvalidOption(f"meta is not JSON: {exc}") from None
    if size > MAX_META_BYTES:
        raise InvalidOption(f"meta is {size} bytes of JSON, over the {MAX_META_BYTES}-byte limit")
    return value


MAX_PROGRESS_BYTES = 4096


def progress(value: object) -> str:
    """``context.set_progress``'s value as JSON text: a finite number, or a
    JSON object of at most 4 KiB."""
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        raise InvalidOption(
            f"progress must be a number or a JSON object (a dict), got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidOption(f"progress must be a finite number, got {value!r}")
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidOption(f"progress is not JSON: {exc}") from None
    if len(text.encode()) > MAX_PROGRESS_BYTES:
        raise InvalidOption(f"progress is over the {MAX_PROGRESS_BYTES}-byte limit")
    return text


def payload_object(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidPayload(f"payload must be a JSON object (a dict), got {type(value).__name__}")
    for k in value:
        if not isinstance(k, str):
            raise InvalidPayload(
                f"payload keys must be strings (they become keyword arguments), got {k!r}"
            )
    return value
