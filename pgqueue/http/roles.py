"""Which database role each kind of token runs as.

By default the role ``pgqueue grant`` recorded for the kind (the schema's
``role_grants`` table; the most recent grant when there are several), unless
one is given (``--producer-role`` & co.). The server's own database user must
be a member of each such role (a superuser is), since every request runs
on sessions that start as it (``options=-c role=...``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pgqueue.commands import program
from pgqueue.driver_async import AsyncDriver
from pgqueue.errors import InvalidOption
from pgqueue.grants import KINDS, Kind, role_name
from pgqueue.ops import roles as roles_ops

log = logging.getLogger("pgqueue.http")


async def resolve_roles(
    database: AsyncDriver,
    schema: str,
    kinds: frozenset[Kind],
    given: Mapping[Kind, str | None],
) -> dict[Kind, str | None]:
    """The role per kind in ``kinds``: the given one, else the recorded one,
    else None (the request runs as the server's own user; logged as a
    warning). Raises InvalidOption for a role that does not exist or that the
    server's user cannot SET ROLE to."""
    recorded = await database.run_async(roles_ops.recorded_grants(schema))
    roles: dict[Kind, str | None] = {}
    for kind in KINDS:
        if kind not in kinds:
            continue
        role = given.get(kind) or recorded.get(kind)
        if role is None:
            log.warning(
                "no database role for %s tokens: they run as the server's user %r; "
                "grant one with `%s grant --role NAME --%s` or pass --%s-role",
                kind,
                await database.run_async(roles_ops.current_user()),
                program(),
                kind,
                kind,
            )
            roles[kind] = None
            continue
        role = role_name(role)
        member = await database.run_async(roles_ops.may_become(role))
        if member is None:
            raise InvalidOption(f"{kind} role {role!r} does not exist")
        if not member:
            raise InvalidOption(
                f"the server's database user may not SET ROLE {role!r} (for {kind} tokens): "
                f'run GRANT "{role}" TO <the server\'s user> as a superuser'
            )
        roles[kind] = role
    return roles
