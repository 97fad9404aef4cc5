-- Database roles: the one a transaction runs as (the HTTP API), and the
-- grants `pgqueue grant` recorded (pgqueue/grants.py re-applies them after a
-- migration; the HTTP API runs each kind of token as its role). The GRANT
-- statements themselves are composed per role and kind in pgqueue/grants.py.

-- name: role_current_user
-- The session's user: one row.
SELECT current_user;

-- name: role_membership
-- Whether the session's user may SET ROLE to %(role)s: one row, none when
-- no such role exists.
SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles WHERE rolname = %(role)s;

-- name: role_grants_present
-- Whether the schema records grants (role_grants; absent before that
-- revision): one row, a boolean.
SELECT to_regclass(quote_ident(%(schema)s) || '.role_grants') IS NOT NULL;

-- name: role_grants_latest
-- Per kind, the most recent recorded grant whose role still exists:
-- (kind, role) rows.
SELECT DISTINCT ON (g.kind) g.kind, g.role
FROM {schema}.role_grants g
JOIN pg_roles r ON r.rolname = g.role
ORDER BY g.kind, g.granted_at DESC, g.role;

-- name: role_grants_all
-- Every recorded grant: (role, kind) rows, by role.
SELECT role, kind FROM {schema}.role_grants ORDER BY role;

-- name: role_grants_forget_dropped
-- Forget the recorded grants of roles dropped since: the row count.
DELETE FROM {schema}.role_grants g
WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = g.role);

-- name: schema_owner
-- The owner of schema %(schema)s and whether it is a superuser: one row,
-- none when there is no such schema.
SELECT r.rolname, r.rolsuper
FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
WHERE n.nspname = %(schema)s;
