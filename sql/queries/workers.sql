-- Worker registry and heartbeats.

-- name: worker_register
INSERT INTO {schema}.workers (id, host, pid, queues, concurrency, tasks)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(tasks)s::text[])
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    concurrency = EXCLUDED.concurrency, tasks = EXCLUDED.tasks, last_heartbeat_at = now(),
    lost_at = NULL;

-- name: worker_heartbeat
-- Mark the worker alive (re-registering it if a cleanup removed it).
-- A worker declared lost that speaks again is alive again.
INSERT INTO {schema}.workers (id, host, pid, queues, concurrency, tasks)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(tasks)s::text[])
ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now(), lost_at = NULL;

-- name: worker_deregister
DELETE FROM {schema}.workers WHERE id = %(worker_id)s;

-- name: worker_list
-- Registered workers with the age of their last heartbeat and running job count.
SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_heartbeat_at,
       extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS heartbeat_age_seconds,
       (SELECT count(*) FROM {schema}.jobs j
        WHERE j.status = 'running' AND j.worker_id = w.id) AS running
FROM {schema}.workers w
ORDER BY w.started_at;
