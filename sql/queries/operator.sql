-- Bulk operator statements: cancel by filter, delete a queue, drop the schema.

-- name: job_cancel
-- The one cancel statement (app.cancel, cancel_many, cancel_workflow, the CLI,
-- the dashboard): up to %(limit)s live jobs chosen by ids and/or filters (each
-- filter optional; %(statuses)s are visible statuses: queued, scheduled,
-- running, waiting; %(workflow_id)s: the steps of one workflow). A job that
-- ends cancelled gets %(reason)s as its last_error when one is given. Queued, scheduled and waiting ones end cancelled now; running
-- ones are asked to stop (their worker is told; the job ends cancelled when
-- the attempt ends). A running job already asked is asked again only with
-- %(reask)s (app.cancel), so that repeated batches end. Waits for rows a
-- lease or a task's transaction holds. NOTIFY payloads are those of
-- pgqueue/events.py: 'f:<id>:<status>:<queue>' for a finished job someone
-- waits on, 'c:<id>' to a running job's worker. Returns (id, status before,
-- status after) per job; finished jobs are left alone and return nothing.
WITH target AS (
    SELECT id, status FROM {schema}.jobs_live
    WHERE stage IN ('queued', 'scheduled', 'waiting')
      AND (%(reask)s::boolean OR NOT cancel_requested)
      AND (%(job_ids)s::bigint[] IS NULL OR id = ANY (%(job_ids)s::bigint[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(workflow_id)s::bigint IS NULL
           OR id IN (SELECT job_id FROM {schema}.job_waits
                     WHERE workflow_id = %(workflow_id)s::bigint))
      AND {schema}.visible_status(status, run_at) = ANY (%(statuses)s::text[])
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE
), asked AS (
    -- Running: its worker is asked to stop (the attempt ends cancelled).
    UPDATE {schema}.jobs_live j SET cancel_requested = true
    FROM target t
    WHERE t.status = 'running' AND j.id = t.id
    RETURNING j.id, j.status, j.notify_finish, j.queue
), ended AS (
    -- The others end cancelled now, moved to jobs_cancelled.
    SELECT e.id, e.status, e.notify_finish, e.queue
    FROM (SELECT array_agg(t.id) AS ids FROM target t WHERE t.status <> 'running') x
    CROSS JOIN LATERAL {schema}.finish_jobs(
        x.ids, '{queued,scheduled,waiting}',
        array_fill('cancelled'::{schema}.job_status, ARRAY[cardinality(x.ids)]), now(), NULL,
        array_fill(%(reason)s::text, ARRAY[cardinality(x.ids)])) e
    WHERE x.ids IS NOT NULL
), updated AS (
    SELECT a.id, a.status, a.notify_finish, a.queue FROM asked a
    UNION ALL
    SELECT e.id, e.status, e.notify_finish, e.queue FROM ended e
), notified AS (
    SELECT count(pg_notify({channel}, CASE WHEN u.status = 'running' THEN 'c:' || u.id
               ELSE {schema}.finished_payload(u.id, u.status, u.queue) END)) AS n
    FROM updated u WHERE u.status = 'running' OR u.notify_finish
)
SELECT u.id, t.status::text AS previous, u.status::text AS current
FROM target t JOIN updated u ON u.id = t.id CROSS JOIN notified
ORDER BY u.id;

-- name: job_cancel_count
-- How many live jobs a bulk cancel with these filters would pick now.
SELECT count(*) FROM {schema}.jobs_live
WHERE stage IN ('queued', 'scheduled', 'waiting') AND NOT cancel_requested
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND {schema}.visible_status(status, run_at) = ANY (%(statuses)s::text[]);

-- name: job_status_many
-- The visible status of each of the given jobs found (hot table or archive).
SELECT id, {schema}.visible_status(status, run_at) FROM {schema}.jobs
WHERE id = ANY (%(job_ids)s::bigint[])
UNION ALL
SELECT a.id, a.status::text FROM {schema}.jobs_archive a
WHERE a.id = ANY (%(job_ids)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE j.id = a.id);

-- name: queue_list
-- The names of the queues that exist (got a job or a setting), by name.
SELECT name FROM {schema}.queues ORDER BY name;

-- name: queue_delete
-- Delete a queue's row and settings unless it still holds live or dead jobs
-- (FOR UPDATE: an enqueue into it waits, then recreates the row). Returns
-- whether it was deleted and, when not, how many such jobs block it.
WITH q AS (
    SELECT name FROM {schema}.queues WHERE name = %(queue)s FOR UPDATE
), blocking AS (
    SELECT count(*) AS n FROM {schema}.jobs j
    WHERE j.queue = %(queue)s AND j.status IN ('queued', 'scheduled', 'running', 'dead')
), gone AS (
    DELETE FROM {schema}.queues d USING q, blocking b
    WHERE d.name = q.name AND b.n = 0
    RETURNING d.name
), log_gone AS (
    DELETE FROM {schema}.queue_lease_log l
    WHERE l.queue = %(queue)s AND EXISTS (SELECT 1 FROM gone)
)
SELECT EXISTS (SELECT 1 FROM q) AS existed, EXISTS (SELECT 1 FROM gone) AS deleted,
       (SELECT n FROM blocking) AS blocking;

-- name: schema_summary
-- What `uninstall` would drop: jobs (hot and archived) and live workers.
SELECT (SELECT count(*) FROM {schema}.jobs) AS jobs,
       (SELECT count(*) FROM {schema}.jobs_live WHERE stage IN ('queued', 'scheduled', 'waiting'))
           AS live_jobs,
       (SELECT count(*) FROM {schema}.jobs_archive) AS archived_jobs,
       (SELECT count(*) FROM {schema}.workers
        WHERE last_heartbeat_at > now() - interval '1 minute') AS live_workers;

-- name: schema_drop
-- Drop the schema and everything in it (`pgqueue uninstall`).
DROP SCHEMA {schema} CASCADE;

-- name: schema_drop_scratch
-- Drop a scratch schema if it was made (python -m pgqueue.schema's dumps).
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: schema_create
-- Create the (empty) schema, for sql/schema.sql to fill (python -m
-- pgqueue.schema dumps the schema the file alone makes).
CREATE SCHEMA {schema};
