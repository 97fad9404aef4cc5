"""Database roles: who a session is, who it may become, and the ones
``pgqueue grant`` recorded (``sql/queries/roles.sql``); the HTTP API runs
each request as the role of its token's kind."""

from __future__ import annotations

from pgqueue.ops import Execute, Op

__all__ = [
    "all_grants",
    "current_user",
    "forget_dropped_grants",
    "may_become",
    "recorded_grants",
    "records_grants",
    "schema_owner",
]


def current_user() -> Op[str]:
    """The session's user."""
    row = yield Execute("role_current_user", fetch="one")
    return str(row[0]) if row else "?"


def may_become(role: str) -> Op[bool | None]:
    """Whether the session's user may SET ROLE to ``role``; None: no such role."""
    row = yield Execute("role_membership", {"role": role}, fetch="one")
    return None if row is None else bool(row[0])


def recorded_grants(schema: str) -> Op[dict[str, str]]:
    """{kind: role} of the most recent grant per kind whose role still
    exists; empty when the schema records no grants."""
    if not (yield from records_grants(schema)):
        return {}
    rows = yield Execute("role_grants_latest")
    return {kind: role for kind, role in rows}


def all_grants() -> Op[list[tuple[str, str]]]:
    """(role, kind) of every recorded grant, by role."""
    rows = yield Execute("role_grants_all")
    return [(role, kind) for role, kind in rows]


def forget_dropped_grants() -> Op[int]:
    """Forget the recorded grants of roles dropped since; how many."""
    count: int = yield Execute("role_grants_forget_dropped", fetch="none")
    return count


def schema_owner(schema: str) -> Op[tuple[str, bool] | None]:
    """The owner of ``schema`` and whether it is a superuser; None: no such schema."""
    row = yield Execute("schema_owner", {"schema": schema}, fetch="one")
    return None if row is None else (row[0], bool(row[1]))


def records_grants(schema: str) -> Op[bool]:
    """Whether ``schema`` records grants (from revision 0005 on)."""
    row = yield Execute("role_grants_present", {"schema": schema}, fetch="one")
    return bool(row and row[0])
