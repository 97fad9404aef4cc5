"""Which database role each kind of token runs as.

By default the role ``pgqueue grant`` recorded for the kind (the schema's
``role_grants`` table; the most recent grant when there are several), unless
one is given (``--producer-role`` & co.). The server's own database user must
be a member of each such role (a superuser is), since every request runs
``SET LOCAL ROLE`` to it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from pgqueue.commands import program
from pgqueue.errors import InvalidOption
from pgqueue.grants import KINDS, Kind, role_name

log = logging.getLogger("pgqueue.http")


async def resolve_roles(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    kinds: frozenset[Kind],
    given: Mapping[Kind, str | None],
) -> dict[Kind, str | None]:
    """The role per kind in ``kinds``: the given one, else the recorded one,
    else None (the request runs as the server's own user; logged as a
    warning). Raises InvalidOption for a role that does not exist or that the
    server's user cannot SET ROLE to."""
    recorded = await _recorded(conn, schema)
    roles: dict[Kind, str | None] = {}
    for kind in KINDS:
        if kind not in kinds:
            continue
        role = given.get(kind) or recorded.get(kind)
        if role is None:
            row = await (await conn.execute("SELECT current_user")).fetchone()
            log.warning(
                "no database role for %s tokens: they run as the server's user %r; "
                "grant one with `%s grant --role NAME --%s` or pass --%s-role",
                kind,
                row[0] if row else "?",
                program(),
                kind,
                kind,
            )
            roles[kind] = None
            continue
        role = role_name(role)
        row = await (
            await conn.execute(
                "SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles WHERE rolname = %s",
                (role,),
            )
        ).fetchone()
        if row is None:
            raise InvalidOption(f"{kind} role {role!r} does not exist")
        if not row[0]:
            raise InvalidOption(
                f"the server's database user may not SET ROLE {role!r} (for {kind} tokens): "
                f'run GRANT "{role}" TO <the server\'s user> as a superuser'
            )
        roles[kind] = role
    return roles


async def _recorded(conn: psycopg.AsyncConnection[Any], schema: str) -> dict[Kind, str]:
    found = await (
        await conn.execute("SELECT to_regclass(format('%%I.role_grants', %s::text))", (schema,))
    ).fetchone()
    if not found or found[0] is None:
        return {}
    rows = await (
        await conn.execute(
            sql.SQL(
                "SELECT DISTINCT ON (g.kind) g.kind, g.role FROM {} g"
                " JOIN pg_roles r ON r.rolname = g.role"
                " ORDER BY g.kind, g.granted_at DESC, g.role"
            ).format(sql.Identifier(schema, "role_grants"))
        )
    ).fetchall()
    return {kind: role for kind, role in rows if kind in KINDS}
