"""Request bodies: one declaration per field gives both its check and its
JSON Schema, so the OpenAPI document and the server cannot disagree.

A check names the field (``jobs[2].priority``) in the :class:`ApiError` it
raises. The checks here are the gate of the HTTP API (they are as strict as
the schema says); the core validates again behind them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pgqueue import validation
from pgqueue.durations import parse_duration
from pgqueue.errors import InvalidDuration

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_SECONDS = 31_536_000  # a year: what extend() accepts
MAX_DELAY = 36_500 * 86_400  # the core's longest duration
MAX_BATCH = 1000
MAX_TAGS = 16
MAX_META_BYTES = 8 * 1024
MAX_KEY_CHARS = 256  # 1024 bytes of UTF-8 whatever the characters
MAX_ERROR_CHARS = 65_536

# RFC 3339 with an offset; years 1971-2498 so that any offset keeps the time
# inside the range the database stores (1970-2499).
DATE_TIME = (
    r"^(197[1-9]|19[89][0-9]|2[0-3][0-9]{2}|24[0-8][0-9]|249[0-8])"
    r"-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
    r"[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"([Zz]|[+-](0[0-9]|1[0-4]):[0-5][0-9])$"  # PostgreSQL takes offsets up to 15:59
)
# What parse_duration reads (numbers with units, or ISO 8601 with capitals),
# without surrounding blanks; it refuses what this lets through and it does not.
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+$|^P[0-9.WDTHMS]+$"
TEXT = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"  # not blank, no control chars
TAG = r"^[A-Za-z0-9_.:-]{1,64}$"
QUEUE = r"^[A-Za-z0-9_.:-]{1,128}$"
NO_NUL = r"^[^\x00]+$"
GROUP_KEY = r"^[^\x00-\x1f\x7f-\x9f]+$"  # no control characters


class ApiError(Exception):
    """An answer other than success: HTTP status, error code, message, field."""

    def __init__(self, status: int, error: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.error, self.message, self.field = status, error, message, field

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.error, "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


def invalid(path: str, message: str) -> ApiError:
    return ApiError(422, "invalid_field", f"{path}: {message}", path)


# --- field types -----------------------------------------------------------------


class Type:
    """A field's type: its JSON Schema and its check."""

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, value: Any, path: str) -> Any:
        raise NotImplementedError


def _is_int(value: Any) -> bool:
    # JSON Schema's integer: any number without a fractional part, never a boolean.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


@dataclass(frozen=True)
class Int(Type):
    minimum: int
    maximum: int

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}

    def parse(self, value: Any, path: str) -> int:
        if not _is_int(value):
            raise invalid(path, f"must be an integer, got {_show(value)}")
        number = int(value)
        if not self.minimum <= number <= self.maximum:
            raise invalid(path, f"must be from {self.minimum} to {self.maximum}, got {number}")
        return number


@dataclass(frozen=True)
class Number(Type):
    minimum: float
    maximum: float

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "minimum": self.minimum, "maximum": self.maximum}

    def parse(self, value: Any, path: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise invalid(path, f"must be a number, got {_show(value)}")
        if not self.minimum <= value <= self.maximum:
            raise invalid(path, f"must be from {self.minimum:g} to {self.maximum:g}, got {value}")
        return float(value)


class Bool(Type):
    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}

    def parse(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise invalid(path, f"must be true or false, got {_show(value)}")
        return value


@dataclass(frozen=True)
class Str(Type):
    max_length: int
    pattern: str | None = None
    min_length: int = 1
    what: str = ""  # what the pattern means, for messages

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "string",
            "minLength": self.min_length,
            "maxLength": self.max_length,
        }
        if self.pattern:
            out["pattern"] = self.pattern
        return out

    def parse(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise invalid(path, f"must be a string, got {_show(value)}")
        if not self.min_length <= len(value) <= self.max_length:
            raise invalid(
                path, f"must have {self.min_length} to {self.max_length} characters, "
                f"got {len(value)}"
            )  # fmt: skip
        if self.pattern and not _compiled(self.pattern).search(value):
            raise invalid(path, f"must be {self.what or 'text matching ' + self.pattern}")
        if not validation.unicode_text(value):
            raise invalid(path, validation.NOT_UNICODE)
        return value


class DateTime(Type):
    def schema(self) -> dict[str, Any]:
        return {
            "type": "string",
            "pattern": DATE_TIME,
            "description": "RFC 3339 date-time with an offset, e.g. 2030-01-01T09:00:00Z",
        }

    def parse(self, value: Any, path: str) -> datetime:
        if not isinstance(value, str) or not _compiled(DATE_TIME).search(value):
            raise invalid(
                path,
                "must be an RFC 3339 date-time with an offset between 1971 and 2498, "
                f"e.g. 2030-01-01T09:00:00Z, got {_show(value)}",
            )
        try:
            return datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
        except ValueError:
            raise invalid(path, f"is not a date that exists: {value!r}") from None


class Duration(Type):
    """Seconds (a number) or a duration with units, as everywhere in pgqueue
    (:func:`pgqueue.durations.parse_duration`): ``"30s"``, ``"1h30m"``,
    ``"PT15M"``; at most 36500 days."""

    def schema(self) -> dict[str, Any]:
        return {
            "anyOf": [
                Number(0, MAX_DELAY).schema(),
                {"type": "string", "pattern": DURATION, "maxLength": 64},
            ],
        }

    def parse(self, value: Any, path: str) -> float | timedelta:
        if not isinstance(value, str):
            try:
                return Number(0, MAX_DELAY).parse(value, path)
            except ApiError:
                raise invalid(
                    path, f"must be seconds (a number) or a duration like 30s, got {_show(value)}"
                ) from None
        if len(value) > 64 or not _compiled(DURATION).fullmatch(value):  # no trailing newline
            raise invalid(
                path, f"must be a duration like 30s, 15m, 1h30m or PT15M, got {_show(value)}"
            )
        try:
            return parse_duration(value)
        except InvalidDuration as exc:
            raise invalid(path, str(exc)) from None


@dataclass(frozen=True)
class JsonObject(Type):
    """A JSON object; ``max_bytes`` bounds its JSON text."""

    max_bytes: int | None = None

    def schema(self) -> dict[str, Any]:
        return {"type": "object"}

    def parse(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise invalid(path, f"must be a JSON object, got {_show(value)}")
        if self.max_bytes is not None:
            size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            if size > self.max_bytes:
                raise invalid(path, f"is {size} bytes of JSON; at most {self.max_bytes}")
        return value


class AnyJson(Type):
    def schema(self) -> dict[str, Any]:
        return {}

    def parse(self, value: Any, path: str) -> Any:
        return value


@dataclass(frozen=True)
class Array(Type):
    items: Type
    max_items: int
    min_items: int = 0

    def schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "items": self.items.schema(),
            "minItems": self.min_items,
            "maxItems": self.max_items,
        }

    def parse(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise invalid(path, f"must be an array, got {_show(value)}")
        if not self.min_items <= len(value) <= self.max_items:
            raise invalid(
                path, f"must have {self.min_items} to {self.max_items} items, got {len(value)}"
            )
        return [self.items.parse(item, f"{path}[{i}]") for i, item in enumerate(value)]


@dataclass(frozen=True)
class Prop:
    type: Type
    required: bool = False
    nullable: bool = True  # null means "not given" for optional fields
    description: str = ""


@dataclass(frozen=True)
class Body(Type):
    """A JSON object with known fields only."""

    name: str
    props: Mapping[str, Prop]
    exclusive: tuple[tuple[str, str], ...] = ()  # pairs that may not both be given
    extra_checks: tuple[Callable[[dict[str, Any], str], None], ...] = field(default=())

    def schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for key, prop in self.props.items():
            one = prop.type.schema()
            if not prop.required and prop.nullable and one:
                one = {"anyOf": [one, {"type": "null"}]}
            if prop.description:
                one = {**one, "description": prop.description}
            properties[key] = one
        out: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }
        required = [k for k, p in self.props.items() if p.required]
        if required:
            out["required"] = required
        if self.exclusive:
            out["not"] = {"anyOf": [_both(a, b) for a, b in self.exclusive]}
        return out

    def parse(self, value: Any, path: str = "") -> dict[str, Any]:
        where = path or "body"
        if not isinstance(value, dict):
            raise ApiError(
                422 if path else 400,
                "invalid_field" if path else "invalid_body",
                f"{where} must be a JSON object, got {_show(value)}",
                path or None,
            )
        for key in value:
            if key not in self.props:
                name = f"{path}.{key}" if path else key
                known = ", ".join(self.props)
                raise invalid(name, f"unknown field (known: {known})")
        out: dict[str, Any] = {}
        for key, prop in self.props.items():
            name = f"{path}.{key}" if path else key
            given = value.get(key)
            if given is None:
                if prop.required:
                    raise invalid(name, "is required")
                if key in value and not prop.nullable:
                    raise invalid(name, "may not be null")
                out[key] = None
                continue
            out[key] = prop.type.parse(given, name)
        for a, b in self.exclusive:
            if out.get(a) is not None and out.get(b) is not None:
                name = f"{path}.{b}" if path else b
                raise invalid(name, f"give {a} or {b}, not both")
        return out


def _both(a: str, b: str) -> dict[str, Any]:
    present = {"not": {"type": "null"}}
    return {"required": [a, b], "properties": {a: present, b: present}}


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    found = _PATTERNS.get(pattern)
    if found is None:
        found = _PATTERNS[pattern] = re.compile(pattern)
    return found


def _show(value: Any) -> str:
    if value is None:
        return "null"
    kind = {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)  # fmt: skip
    text = json.dumps(value)[:60] if not isinstance(value, dict | list) else ""
    return f"{kind} {text}".strip()


# --- the bodies --------------------------------------------------------------------

ATTEMPT_ID = Int(1, INT64_MAX)
JOB_ID = Int(1, INT64_MAX)
KEY = Str(MAX_KEY_CHARS, NO_NUL, what="1 to 256 characters without NUL")


ENQUEUE = Body(
    "EnqueueRequest",
    {
        "task": Prop(
            Str(validation.MAX_TASK_NAME, TEXT, what="a task name without control characters"),
            required=True,
            description="Task name; the task need not be known to this server.",
        ),
        "payload": Prop(JsonObject(), description="The task's keyword arguments."),
        "queue": Prop(Str(128, QUEUE, what="a queue name: 1-128 of A-Z a-z 0-9 _ . : -")),
        "priority": Prop(Int(-32768, 32767), description="Higher runs first."),
        "run_at": Prop(DateTime()),
        "delay": Prop(
            Duration(),
            description="From now: seconds (a number) or a duration like 30s, 1h30m, PT15M.",
        ),
        "dedup_key": Prop(KEY),
        "serial_key": Prop(KEY),
        "max_attempts": Prop(Int(0, INT32_MAX), description="0: unlimited."),
        "tags": Prop(
            Array(Str(64, TAG, what="a tag: 1-64 of A-Z a-z 0-9 _ . : -"), MAX_TAGS),
            description="Up to 16 tags of [A-Za-z0-9_.:-]{1,64}.",
        ),
        "meta": Prop(
            JsonObject(MAX_META_BYTES),
            description="A JSON object of up to 8 KiB.",
        ),
        "depends_on": Prop(
            Array(JOB_ID, MAX_BATCH),
            description="Job ids this job waits for.",
        ),
        "group_key": Prop(
            Str(
                validation.MAX_GROUP_KEY,
                GROUP_KEY,
                what="1 to 200 characters without control characters",
            ),
            description="The tenant, customer, API key or domain the job belongs to.",
        ),
    },
    exclusive=(("run_at", "delay"),),
)


ENQUEUE_BATCH = Body(
    "EnqueueBatchRequest", {"jobs": Prop(Array(ENQUEUE, MAX_BATCH), required=True)}
)


def lease_body(max_wait: float) -> Body:
    """The lease body; ``wait`` up to ``max_wait`` seconds."""
    return Body(
        "LeaseRequest",
        {
            "worker_id": Prop(
                Str(255, TEXT, what="1-255 characters without control characters"),
                description="Who holds the leases (default: http@<client address>).",
            ),
            "max": Prop(Int(1, MAX_BATCH), description="Lease up to this many jobs (default 1)."),
            "lease_seconds": Prop(
                Int(1, MAX_SECONDS), description="Lease length (default: each job's own)."
            ),
            "wait": Prop(
                Number(0, max_wait),
                description="Long-poll: wait up to this many seconds for a job.",
            ),
        },
    )


ACK = Body("AckRequest", {"attempt_id": Prop(ATTEMPT_ID, required=True), "result": Prop(AnyJson())})
FAIL = Body(
    "FailRequest",
    {
        "attempt_id": Prop(ATTEMPT_ID, required=True),
        "error": Prop(Str(MAX_ERROR_CHARS, min_length=0), required=True),
        "retry_at": Prop(DateTime(), description="Retry then (default: the job's backoff)."),
        "permanent": Prop(Bool(), description="Dead-letter now."),
    },
)
SEND_EVENT = Body(
    "SendEventRequest", {"payload": Prop(AnyJson(), description="The event's payload (any JSON).")}
)
NACK = Body("NackRequest", {"attempt_id": Prop(ATTEMPT_ID, required=True)})
EXTEND = Body(
    "ExtendRequest",
    {
        "attempt_id": Prop(ATTEMPT_ID, required=True),
        "seconds": Prop(Int(1, MAX_SECONDS), required=True),
    },
)
ACK_ITEM = Body(
    "AckItem",
    {
        "job_id": Prop(JOB_ID, required=True),
        "attempt_id": Prop(ATTEMPT_ID, required=True),
        "result": Prop(AnyJson()),
    },
)
ACK_MANY = Body(
    "AckManyRequest", {"acks": Prop(Array(ACK_ITEM, MAX_BATCH, min_items=1), required=True)}
)


def job_id(text: str) -> int:
    """A job id from the URL path."""
    if not re.fullmatch(r"[0-9]{1,19}", text) or not 1 <= int(text) <= INT64_MAX:
        raise invalid("id", f"must be a job id (a positive 64-bit integer), got {text[:40]!r}")
    return int(text)


def queue_name(text: str) -> str:
    """A queue name from the URL path."""
    if not _compiled(QUEUE).search(text):
        raise invalid(
            "queue", f"must be 1-128 characters of A-Z a-z 0-9 _ . : -, got {text[:80]!r}"
        )
    return text
