-- Health checks for `pgqueue check` and App.check(): cheap reads only, each
-- an index range scan or a scan of a small table.

-- name: health_server
-- The server's wall clock (clock_timestamp(), not the transaction start, so
-- that the client can bracket it for the skew) and its version.
SELECT clock_timestamp() AS server_now, current_setting('server_version') AS server_version;

-- name: health_schema_revision
-- The Alembic revision of the schema (fails when it was never migrated).
SELECT version_num FROM {schema}.alembic_version;

-- name: health_stuck_jobs
-- Running jobs whose lease expired: their worker died or froze and no reaper
-- has reclaimed them yet. The count, the first %(sample)s ids, the worst age.
SELECT count(*) AS stuck,
       coalesce((array_agg(id ORDER BY lease_expires_at))[1:%(sample)s::integer], '{}')
           AS job_ids,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(lease_expires_at))::float8
           AS oldest_expired_seconds
FROM {schema}.jobs_live
WHERE stage = 'queued' AND status = 'running' AND lease_expires_at < coalesce(%(now)s::timestamptz, now());

-- name: health_dead_workers
-- Registered workers silent for longer than %(seconds)s (a worker that stops
-- cleanly deregisters; these were killed or hang) that still hold running
-- jobs (%(holding_jobs)s; `check`: once the reaper reclaimed those, a lost
-- worker is no failure), or all of them (the doctor's warning).
SELECT w.id, w.host, w.pid,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - w.last_heartbeat_at)::float8
           AS heartbeat_age_seconds
FROM {schema}.workers w
WHERE w.last_heartbeat_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(seconds)s)
  AND (NOT %(holding_jobs)s::boolean
       OR EXISTS (SELECT 1 FROM {schema}.jobs_live j WHERE j.stage = 'queued' AND j.status = 'running' AND j.worker_id = w.id))
ORDER BY w.last_heartbeat_at;

-- name: health_queue_backlog
-- Queues not paused whose oldest ready job has waited longer than %(seconds)s.
-- A due job may still be stored as 'scheduled' until a worker stages it.
SELECT q.name AS queue,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - b.oldest)::float8
           AS oldest_ready_age_seconds
FROM {schema}.queues q
CROSS JOIN LATERAL (
    SELECT {schema}.queue_oldest_ready(q.name, %(now)s::timestamptz) AS oldest
) b
WHERE NOT q.paused
  AND b.oldest < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(seconds)s)
ORDER BY b.oldest, q.name;
