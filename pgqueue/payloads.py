"""JSON encoding of job batches, payloads and results, with the size limit."""

from __future__ import annotations

import json
from typing import Any

from pgqueue.errors import InvalidPayload, PayloadTooLarge

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _find_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_find_nul(k) or _find_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_find_nul(v) for v in value)
    return False


def _explain_item(index: int, payload: Any, limit: int) -> None:
    """Raise the precise error for one payload, if it has one."""
    where = f"payload of job #{index}" if index >= 0 else "payload"
    try:
        text = _dumps(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(f"{where} is not JSON-serialisable: {exc}") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPayload(
            f"{where} holds a string that is not valid Unicode (lone surrogate)"
        ) from None
    if size > limit:
        raise PayloadTooLarge(f"{where} is {size} bytes of JSON, over the {limit}-byte limit")
    if _find_nul(payload):
        raise InvalidPayload(f"{where} contains a NUL character, which PostgreSQL cannot store")


def encode_batch(jobs: list[dict[str, Any]], max_payload_bytes: int) -> str:
    """The JSON array sent to ``enqueue_batch``; validates every payload.

    Fast path: one ``json`` call for the whole batch. Only when that fails or the
    document is larger than one payload may be are the payloads checked one by one
    to name the culprit.
    """
    try:
        doc = _dumps(jobs)
        encoded_len = len(doc.encode("utf-8"))
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError):
        doc, encoded_len = "", -1
    if encoded_len < 0 or encoded_len > max_payload_bytes or "\\u0000" in doc:
        for i, job in enumerate(jobs):
            _explain_item(i if len(jobs) > 1 else -1, job.get("payload", {}), max_payload_bytes)
        if encoded_len < 0:  # pragma: no cover - a job field other than the payload failed
            raise InvalidPayload("job options are not JSON-serialisable")
    return doc


def encode_result(value: Any, max_bytes: int) -> str | None:
    """A task's return value as JSON, or None when it is None, not serialisable or too big."""
    if value is None:
        return None
    try:
        text = _dumps(value)
    except (TypeError, ValueError, RecursionError):
        return None
    if "\\u0000" in text:
        return None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None
    return text if size <= max_bytes else None
