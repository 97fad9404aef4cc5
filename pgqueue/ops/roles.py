"""Database roles: the one a transaction runs as, and the ones ``pgqueue
grant`` recorded (``sql/queries/http.sql``); the HTTP API runs each request
as the role of its token's kind."""

from __future__ import annotations

from pgqueue.ops import Execute, Op

__all__ = ["current_user", "may_become", "recorded_grants", "set_local_role"]


def set_local_role(role: str) -> Op[None]:
    """``SET LOCAL ROLE role``: the rest of the transaction runs as ``role``."""
    yield Execute("role_set_local", {"role": role}, fetch="one")


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
    present = yield Execute("role_grants_present", {"schema": schema}, fetch="one")
    if not (present and present[0]):
        return {}
    rows = yield Execute("role_grants_latest")
    return {kind: role for kind, role in rows}
