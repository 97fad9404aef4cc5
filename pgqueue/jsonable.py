"""Plain JSON values from pgqueue's types: one serialiser for every JSON face
of the library and the CLI (``--json``, the dashboard's ``/api/``, the HTTP
API), so that they answer alike."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from datetime import date, datetime, timedelta
from typing import Any


def _is_default(f: dataclasses.Field[Any], value: Any) -> bool:
    current = getattr(value, f.name)
    if f.default_factory is not dataclasses.MISSING:
        return bool(current == f.default_factory())
    return bool(current == f.default)


def to_jsonable(value: Any) -> Any:
    """Plain JSON values from pgqueue's types: dataclasses and named tuples
    become objects with their field names, times ISO-8601 text, durations
    seconds, enums their value. A field marked ``OMIT_DEFAULT`` (see
    ``pgqueue.models``) is left out while it holds its default."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get("json") == "omit_default" and _is_default(f, value))
        }
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {k: to_jsonable(v) for k, v in value._asdict().items()}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return value


def job_jsonable(job: Any, *, lease_token: bool = False) -> dict[str, Any]:
    """A job (``pgqueue.Job``) as JSON for a face whose reader may not hold
    its lease: the running attempt's ``attempt_id`` (the fencing token every
    ack, fail, nack and extend presents) is ``null`` unless ``lease_token``
    (an admin). Finished attempts keep theirs: they can fence nothing."""
    out: dict[str, Any] = to_jsonable(job)
    if job.attempt_history is None:
        out.pop("attempt_history", None)
    elif not lease_token:
        for attempt in out["attempt_history"]:
            if attempt["finished_at"] is None:
                attempt["attempt_id"] = None
    return out


__all__ = ["job_jsonable", "to_jsonable"]
