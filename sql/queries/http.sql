-- The SQL worker API (lease, ack, fail, nack, extend) as the HTTP API
-- (pgqueue/http) calls it: on sessions that start as the role of the
-- request's token, so that the database checks its privileges.

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
