"""JSON encoding of job batches, payloads and results, with the size limit."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from collections.abc import Callable, Iterable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import PurePath
from typing import Any
from uuid import UUID

from pgqueue.errors import InvalidPayload, PayloadTooLarge

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _not_serialisable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _fast_dumps() -> Callable[[Any], str]:
    """``_dumps`` for the enqueue hot paths: the C encoder made once (the
    json module makes one per call) and without the circular-reference
    check (a cycle ends in RecursionError, and the caller then explains the
    payload with ``_dumps``)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - no C accelerator
        return _dumps
    iterencode = make(
        None, _not_serialisable, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    join = "".join
    return lambda value: join(iterencode(value, 0))


_dumps_fast = _fast_dumps()

#: How deep a payload (or result) may nest arrays and objects, itself counting
#: as one. PostgreSQL stores far deeper JSON, but psycopg reads jsonb with
#: Python's json module, which fails near the recursion limit (~1000 levels):
#: a deeper job could be enqueued and then never leased or read. The SQL
#: enqueue() function enforces the same number (sql/schema.sql).
MAX_PAYLOAD_DEPTH = 256

# Depth is measured on the UTF-8 JSON text, where a bracket or quote byte is
# always that character (the bytes of multi-byte characters are >= 0x80).
_NOT_SHAPE = bytes(b for b in range(256) if b not in b'[]{}"')
_AS_BRACES = bytes.maketrans(b"[]", b"{}")
_PLAIN_STRING = re.compile(rb'"[^"]*"')  # a JSON string once escapes are gone


def _find_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_find_nul(k) or _find_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_find_nul(v) for v in value)
    return False


def nests_deeper(data: bytes, limit: int) -> bool:
    """Whether the JSON text ``data`` nests arrays/objects more than ``limit``
    deep. Cheap when it cannot: a count of opening brackets bounds the depth."""
    if data.count(b"{") + data.count(b"[") <= limit:
        return False
    # Escapes go first, as JSON reads them (left to right: escaped backslashes,
    # then escaped quotes): every quote left delimits a string. Then only
    # brackets and quotes are kept, adjacent quotes dropped (no bracket between
    # them: only the pairing of strings changes), and strings holding brackets cut out.
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = data.translate(_AS_BRACES, _NOT_SHAPE).replace(b'""', b"")
    if b'"' in shape:
        shape = _PLAIN_STRING.sub(b"", shape)
    # Each pass removes the innermost level everywhere (at C speed); typical
    # JSON is gone after a few. A deeper remainder is walked, in linear time.
    levels = 0
    while shape and levels < min(8, limit):
        shape = shape.replace(b"{}", b"")
        levels += 1
    depth = levels
    for byte in shape:
        if byte == 0x7B:  # {
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _explain_item(index: int, payload: Any, limit: int) -> None:
    """Raise the precise error for one payload, if it has one."""
    where = f"payload of job #{index}" if index >= 0 else "payload"
    too_deep = f"{where} nests arrays/objects deeper than {MAX_PAYLOAD_DEPTH} levels"
    try:
        text = _dumps(payload)
    except RecursionError:
        raise InvalidPayload(too_deep) from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{where} is not JSON-serialisable: {exc}") from None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(
            f"{where} holds a string that is not valid Unicode (lone surrogate)"
        ) from None
    if len(data) > limit:
        raise PayloadTooLarge(f"{where} is {len(data)} bytes of JSON, over the {limit}-byte limit")
    # Before the NUL search, which recurses as deep as the payload nests.
    if nests_deeper(data, MAX_PAYLOAD_DEPTH):
        raise InvalidPayload(too_deep)
    if _find_nul(payload):
        raise InvalidPayload(f"{where} contains a NUL character, which PostgreSQL cannot store")


class UndecodableJson(str):
    """Stands in for a stored JSON value too deeply nested for Python to
    decode (it got in around the enqueue checks); holds the reason."""


def loads_stored(data: str | bytes) -> Any:
    """``json.loads`` for values read from the database: never raises on
    nesting, so one bad payload cannot fail a whole leased batch."""
    try:
        return json.loads(data)
    except RecursionError:
        return UndecodableJson("stored JSON is nested too deeply to decode")


_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{19}")
_orjson_module: Any = False  # False: not looked up yet; None: not installed or disabled


def orjson() -> Any:
    """The orjson module when ``pgqueue[speed]`` installed it (None when it
    is missing, or disabled with ``PGQUEUE_NO_ORJSON=1``); looked up once, on
    first use, so that ``import pgqueue`` never imports it."""
    global _orjson_module
    if _orjson_module is False:
        _orjson_module = None
        if os.environ.get("PGQUEUE_NO_ORJSON", "") in ("", "0"):
            try:
                import orjson
            except ImportError:
                pass
            else:
                _orjson_module = orjson
    return _orjson_module


def loads_many(texts: list[str | None] | list[bytes | None]) -> list[Any]:
    """Decode many stored JSON texts (jsonb as read from the database, all
    str or all bytes; None for NULL) in one call: the texts joined into one
    JSON array.

    The same values as :func:`loads_stored` one by one: orjson, when
    installed, decodes what it reads exactly as json does (jsonb text is
    always valid JSON, without NaN); what it refuses or would read
    differently (nesting past its limit, huge numbers) is decoded by the
    json module, which gives its usual answer, one text at a
    time when the batch nests too deep for it.
    """
    if not texts:
        return []
    doc: str | bytes
    if isinstance(next((t for t in texts if t is not None), ""), str):
        doc = "[" + ",".join(["null" if t is None else t for t in texts]) + "]"  # type: ignore[misc]
        long_digits = _LONG_DIGITS.search(doc) is not None
    else:
        doc = b"[" + b",".join([b"null" if t is None else t for t in texts]) + b"]"  # type: ignore[misc]
        long_digits = _LONG_DIGITS_BYTES.search(doc) is not None
    fast = orjson()
    # orjson reads integers past 64 bits as floats: leave those to json.
    if fast is not None and not long_digits:
        try:
            return fast.loads(doc)  # type: ignore[no-any-return]
        except fast.JSONDecodeError:
            pass
    try:
        return json.loads(doc)  # type: ignore[no-any-return]
    except RecursionError:
        return [None if t is None else loads_stored(t) for t in texts]


def encode_batch(
    jobs: list[dict[str, Any]],
    max_payload_bytes: int,
    dedup: bool | None = None,
) -> str:
    """The document sent to ``enqueue_batch``: the JSON array of ``jobs``, or,
    given whether any job has a ``dedup`` key, ``{"jobs": [...], "dedup": ...}``.
    Validates every payload.

    Fast path: one ``json`` call for the whole batch. Only when that fails or the
    document is larger than one payload may be are the payloads checked one by one
    to name the culprit.
    """
    # The array and each job object nest every payload two levels deeper.
    doc = _encode_checked(jobs, (job.get("payload", {}) for job in jobs), 2, max_payload_bytes)
    if dedup is None:
        return doc
    return f'{{"dedup":{_dumps(dedup)},"jobs":{doc}}}'


def encode_payload(payload: Any, max_payload_bytes: int) -> str:
    """The JSON text of one job's payload, with the checks of :func:`encode_batch`."""
    try:
        doc = _dumps_fast(payload)
        data = doc.encode("utf-8")
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError):
        doc, data = "", b""
    if (
        not data
        or len(data) > max_payload_bytes
        or "\\u0000" in doc
        or nests_deeper(data, MAX_PAYLOAD_DEPTH)
    ):
        _explain_item(-1, payload, max_payload_bytes)
    return doc


def encode_payloads(payloads: list[Any], max_payload_bytes: int) -> str:
    """The JSON array of many jobs' payloads, each checked as in :func:`encode_batch`."""
    # The array nests every payload one level deeper.
    return _encode_checked(payloads, payloads, 1, max_payload_bytes)


def _encode_checked(
    value: list[Any], payloads: Iterable[Any], nesting: int, max_payload_bytes: int
) -> str:
    """``value`` as JSON in one call. ``payloads`` (one per item of ``value``,
    each ``nesting`` levels down) are read only when that fails or the document
    could hold a bad payload: then each is checked to name the culprit."""
    try:
        doc = _dumps_fast(value)
        data = doc.encode("utf-8")
        encoded_len = len(data)
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError):
        doc, data, encoded_len = "", b"", -1
    if (
        encoded_len < 0
        or encoded_len > max_payload_bytes
        or "\\u0000" in doc
        or nests_deeper(data, MAX_PAYLOAD_DEPTH + nesting)
    ):
        for i, payload in enumerate(payloads):
            _explain_item(i if len(value) > 1 else -1, payload, max_payload_bytes)
        if encoded_len < 0:  # pragma: no cover - a field other than a payload failed
            raise InvalidPayload("job options are not JSON-serialisable")
    return doc


def encode_options(job: dict[str, Any]) -> str:
    """The JSON text of a job object without its payload (validated options)."""
    return _dumps_fast(job)


class UnstoredResult(str):
    """Stands in for a task's return value that cannot be stored (not JSON,
    too big, ...); the text says why. The job still succeeds: its
    ``last_error`` then reads ``result not stored: <why>`` and ``result()``
    raises :class:`pgqueue.errors.ResultNotStored` instead of returning None."""


#: How ``last_error`` of a succeeded job starts when its result was not stored.
RESULT_NOT_STORED = "result not stored: "


def _result_default(value: Any) -> Any:
    """The documented encoding of common non-JSON return values."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, UUID | Decimal | PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:  # mixed types: keep an arbitrary but complete order
            return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"a {type(value).__name__} is not JSON-serialisable")


_dumps_result = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_result_default
).encode


def encode_result(value: Any, max_bytes: int) -> str | None:
    """A task's return value as JSON text; None for None. Besides JSON types,
    datetime/date/time become ISO-8601 text, timedelta seconds, UUID, Decimal
    and paths text, sets and tuples lists, enums their value, dataclasses
    objects. What still cannot be stored comes back as an
    :class:`UnstoredResult` saying why."""
    if value is None:
        return None
    try:
        text = _dumps_result(value)
    except RecursionError:
        return UnstoredResult("the value nests too deeply to encode")
    except (TypeError, ValueError) as exc:
        return UnstoredResult(f"the value is not JSON-serialisable ({exc})")
    if "\\u0000" in text:
        return UnstoredResult("the value contains a NUL character, which PostgreSQL cannot store")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        return UnstoredResult("the value holds a string that is not valid Unicode")
    if len(data) > max_bytes:
        return UnstoredResult(
            f"the value is {len(data)} bytes of JSON, over the {max_bytes}-byte result limit"
        )
    if nests_deeper(data, MAX_PAYLOAD_DEPTH):
        return UnstoredResult(f"the value nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    return text
