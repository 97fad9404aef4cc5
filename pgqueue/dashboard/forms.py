"""Reading an action's request: path ids and form fields, checked, with the
message a user sees when they are wrong (:class:`InvalidOption`: a 400)."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request

from pgqueue.errors import InvalidOption, JobNotFound

#: Jobs one selection may name; more goes through "everything the filter matches".
MAX_SELECTED = 1000
#: The largest job id (a bigint).
MAX_ID = 2**63 - 1


def job_id_of(request: Request) -> int:
    """The ``{job_id}`` of the path."""
    value = request.path_params["job_id"]
    if value < 1:
        raise InvalidOption(f"job id must be a positive integer, got {value}")
    if value > MAX_ID:  # ids are bigints: no job has it (not a database error)
        raise JobNotFound(value)
    return int(value)


def int_list(form: FormData, name: str) -> list[int]:
    """The selected job ids of a form field."""
    out = []
    for value in form.getlist(name):
        try:
            number = int(str(value))
        except ValueError:
            raise InvalidOption(f"{name} must be job ids, got {value!r}") from None
        if number < 1:
            raise InvalidOption(f"{name} must be positive job ids, got {number}")
        out.append(number)
    if len(out) > MAX_SELECTED:
        raise InvalidOption(f"select at most {MAX_SELECTED} jobs at once; act on a filter for more")
    return out


def text(value: Any) -> str | None:
    """A form field's text, stripped; None when empty or not text."""
    return value.strip() or None if isinstance(value, str) else None


def total(form: FormData) -> int:
    """The running total a bulk action's progress form carries (0 when absent)."""
    try:
        return max(0, int(str(form.get("total") or 0)))
    except ValueError:
        return 0
