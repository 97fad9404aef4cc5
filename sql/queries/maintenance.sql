-- Reaper, archive, prune, table statistics. Each runs in bounded batches with
-- SKIP LOCKED so that any number of them can run beside workers and each other.

-- name: job_reap_expired
-- Jobs whose lease expired: record a 'lease_expired' attempt, then back to the
-- queue with backoff, dead when attempts are used up, cancelled when a cancel
-- was requested. Returns (id, status) of each reaped job.
SELECT job_id, status FROM {schema}.reap_jobs(%(limit)s::integer, %(now)s::timestamptz);

-- name: job_archive_batch
-- Move up to %(limit)s jobs finished more than %(older_than)s ago (by the
-- database clock) into jobs_archive.
-- SKIP LOCKED: concurrent archives take disjoint rows; a crash rolls back.
WITH moved AS (
    DELETE FROM {schema}.jobs j
    WHERE j.status = ANY (%(statuses)s::{schema}.job_status[]) AND j.id = ANY (ARRAY(
        SELECT id FROM {schema}.jobs
        WHERE status = ANY (%(statuses)s::{schema}.job_status[]) AND finished_at < (coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED))
    RETURNING j.*
)
INSERT INTO {schema}.jobs_archive (
    id, priority, status, attempts, max_attempts, lease_seconds, run_at, created_at,
    attempt_id, attempt_started_at, lease_expires_at, finished_at, cancel_requested,
    notify_finish, backoff_base, backoff_factor, backoff_max, backoff_jitter, queue, task,
    payload, worker_id, dedup_key, serial_key, last_error, result, tags, meta, snoozes, progress,
    group_key)
SELECT id, priority, status, attempts, max_attempts, lease_seconds, run_at, created_at,
       attempt_id, attempt_started_at, lease_expires_at, finished_at, cancel_requested,
       notify_finish, backoff_base, backoff_factor, backoff_max, backoff_jitter, queue, task,
       payload, worker_id, dedup_key, serial_key, last_error, result, tags, meta, snoozes, progress,
       group_key
FROM moved;

-- name: job_archive_count
-- How many finished jobs an archive run with this cutoff would move.
SELECT count(*) FROM {schema}.jobs
WHERE status = ANY (%(statuses)s::{schema}.job_status[]) AND finished_at < (coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval);

-- name: attempt_prune_batch
-- Delete up to %(limit)s attempt records finished before the cutoff, except
-- those of jobs that are still live.
DELETE FROM {schema}.job_attempts a
WHERE a.id = ANY (ARRAY(
    SELECT p.id FROM {schema}.job_attempts p
    WHERE p.finished_at < (coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs_live j
                      WHERE j.id = p.job_id AND j.stage IN ('queued', 'scheduled', 'waiting'))
    ORDER BY p.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED));

-- name: archive_prune_batch
-- Delete up to %(limit)s archived jobs finished before the cutoff, with their
-- dependency bookkeeping, durable steps and the workflows left without steps. (The row count
-- is the last statement's: the archived jobs deleted.)
WITH doomed AS MATERIALIZED (
    SELECT id FROM {schema}.jobs_archive
    WHERE finished_at < (coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), edges AS (
    DELETE FROM {schema}.job_dependencies d WHERE d.job_id IN (SELECT id FROM doomed)
), steps AS (
    DELETE FROM {schema}.job_steps s WHERE s.job_id IN (SELECT id FROM doomed)
), waits AS (
    DELETE FROM {schema}.job_waits w WHERE w.job_id IN (SELECT id FROM doomed)
    RETURNING w.workflow_id
), flows AS (
    DELETE FROM {schema}.workflows f
    WHERE f.id IN (SELECT workflow_id FROM waits)
      AND NOT EXISTS (SELECT 1 FROM {schema}.job_waits r
                      WHERE r.workflow_id = f.id AND r.job_id NOT IN (SELECT id FROM doomed))
)
DELETE FROM {schema}.jobs_archive a WHERE a.id IN (SELECT id FROM doomed);

-- name: prune_count
-- How many attempt records and archived jobs a prune with this cutoff would delete.
SELECT (SELECT count(*) FROM {schema}.job_attempts p
        WHERE p.finished_at < (coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval)
          AND NOT EXISTS (SELECT 1 FROM {schema}.jobs_live j
                          WHERE j.id = p.job_id AND j.stage IN ('queued', 'scheduled', 'waiting'))),
       (SELECT count(*) FROM {schema}.jobs_archive WHERE finished_at < (coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval));

-- name: table_stats
-- Live and dead tuples and size of each pgqueue table (a partitioned table:
-- the sums over its partitions, the latest vacuum of any of them).
SELECT c.relname::text AS table_name, sum(s.n_live_tup)::bigint AS n_live_tup,
       sum(s.n_dead_tup)::bigint AS n_dead_tup,
       sum(pg_total_relation_size(s.relid))::bigint AS total_bytes,
       max(s.last_vacuum) AS last_vacuum, max(s.last_autovacuum) AS last_autovacuum
FROM pg_stat_user_tables s
JOIN pg_class c ON c.oid = coalesce(pg_partition_root(s.relid), s.relid)
WHERE s.schemaname = %(schema_name)s
GROUP BY c.relname
ORDER BY c.relname;

-- name: table_vacuum_analyze
-- VACUUM (ANALYZE) every pgqueue table in one statement (VACUUM_TABLES in
-- pgqueue/ops/maintenance.py lists the same; a test keeps them equal to the
-- schema). VACUUM refuses a transaction block: autocommit connections only.
VACUUM (ANALYZE) {schema}.jobs, {schema}.job_attempts, {schema}.jobs_archive, {schema}.queues,
    {schema}.queue_lease_log, {schema}.workers, {schema}.schedules, {schema}.limits,
    {schema}.role_grants, {schema}.periodic_schedules, {schema}.archive_partitioning,
    {schema}.tasks, {schema}.task_settings, {schema}.task_lease_log, {schema}.workflows,
    {schema}.job_waits, {schema}.job_dependencies, {schema}.retention, {schema}.maintenance,
    {schema}.job_steps, {schema}.events;
