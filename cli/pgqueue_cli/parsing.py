"""Parsing of command-line values into what the library takes.

Each failure raises a pgqueue input error (a ``PgQueueError``), which the root
group prints as one line; Typer's own converters would print a usage box.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pgqueue.durations import parse_duration, parse_time
from pgqueue.errors import InvalidInput, InvalidOption, InvalidPayload


def job_id(text: str) -> int:
    """A job id: a positive integer."""
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidOption(f"job id must be a positive integer, got {text!r}") from None
    if value < 1:
        raise InvalidOption(f"job id must be a positive integer, got {text!r}")
    return value


def duration(option: str, text: str) -> timedelta:
    """A duration (``30s``, ``15m``, ``7d``, ``PT15M``), naming the option on error."""
    try:
        return parse_duration(text)
    except InvalidInput as exc:
        raise type(exc)(f"{option}: {exc}") from None


def optional_duration(option: str, text: str | None) -> timedelta | None:
    return None if text is None else duration(option, text)


def moment(option: str, text: str | None) -> datetime | None:
    """An ISO-8601 time (UTC when it names no zone)."""
    if text is None:
        return None
    try:
        return parse_time(text)
    except InvalidInput as exc:
        raise type(exc)(f"{option}: {exc}") from None


def csv(text: str) -> list[str]:
    """``succeeded,dead`` -> ``["succeeded", "dead"]`` (the library validates them)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def json_object(text: str, source: str) -> dict[str, Any]:
    """A payload: a JSON object (``source`` names where it came from)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidPayload(f"{source} is not valid JSON: {exc}") from None
    except RecursionError:  # json gives up near Python's recursion limit
        raise InvalidPayload(f"{source} nests arrays/objects too deeply") from None
    if not isinstance(value, dict):
        raise InvalidPayload(f"{source} must be a JSON object, got {_json_kind(value)}")
    return value


def json_file(path: str) -> dict[str, Any]:
    """A payload read from a file (``-`` for stdin)."""
    if path == "-":
        return json_object(sys.stdin.read(), "the payload on stdin")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidPayload(f"cannot read --payload-file {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidPayload(f"--payload-file {path!r} is not UTF-8 text") from None
    return json_object(text, f"--payload-file {path!r}")


def json_lines(lines: Sequence[str], source: str) -> list[dict[str, Any]]:
    """One JSON object per non-blank line; the error names the line."""
    payloads = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            payloads.append(json_object(line, f"{source} line {number}"))
    return payloads


def _json_kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
