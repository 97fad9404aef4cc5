-- The statements of the HTTP API (pgqueue/http): the role each kind of token
-- runs as, and the SQL worker API (lease, ack, fail, nack, extend) called
-- in a transaction as that role, so that the database checks its privileges.

-- name: role_set_local
-- SET LOCAL ROLE %(role)s: the rest of the transaction runs as that role
-- (set_config checks membership as SET ROLE does). One row: the role.
SELECT set_config('role', %(role)s, true);

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

-- name: worker_api_lease
-- Up to %(max)s jobs of %(queue)s leased to %(worker_id)s: (job_id,
-- attempt_id, attempt, task, payload, lease_expires_at) rows.
SELECT job_id, attempt_id, attempt, task, payload, lease_expires_at
FROM {schema}.lease(ARRAY[%(queue)s]::text[], %(worker_id)s, %(max)s);

-- name: worker_api_extend_many
-- The leases of (%(job_ids)s, %(attempt_ids)s) still held, extended to
-- now() + %(seconds)s (now(): the transaction's start): (job_id,
-- lease_expires_at) rows.
SELECT t.job_id, now() + make_interval(secs => %(seconds)s)
FROM unnest(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[]) AS t(job_id, attempt_id)
WHERE {schema}.extend(t.job_id, t.attempt_id, %(seconds)s);

-- name: worker_api_extend
-- Extend one lease: one row (extended?, the new expiry if it was).
SELECT {schema}.extend(%(job_id)s, %(attempt_id)s, %(seconds)s),
       now() + make_interval(secs => %(seconds)s);

-- name: worker_api_job_status
-- The status of %(job_id)s and whether a cancel was asked: one row, none
-- for an unknown job.
SELECT status, cancel_requested FROM {schema}.job_status(%(job_id)s);

-- name: worker_api_ack
-- Ack one attempt with its result: one row, true when it was still held.
SELECT {schema}.ack(%(job_id)s, %(attempt_id)s, %(result)s::jsonb);

-- name: worker_api_fail
-- Record a failed attempt: one row, the job's status after it (NULL when
-- the attempt was not held).
SELECT {schema}.fail(%(job_id)s, %(attempt_id)s, %(error)s, %(retry_at)s, %(permanent)s);

-- name: worker_api_nack
-- Hand an attempt back unrun: one row, true when it was still held.
SELECT {schema}.nack(%(job_id)s, %(attempt_id)s);

-- name: worker_api_ack_many
-- Ack attempts without results: the job_id rows of those still held.
SELECT job_id FROM {schema}.ack_many(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[]);

-- name: worker_api_ack_results
-- Ack attempts with results, each pair fenced by ack(): the job_id rows of
-- those still held, in the order given.
SELECT t.job_id
FROM unnest(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(results)s::jsonb[])
    WITH ORDINALITY AS t(job_id, attempt_id, result, n)
WHERE {schema}.ack(t.job_id, t.attempt_id, t.result)
ORDER BY t.n;
