-- Worker registry and heartbeats.

-- name: worker_register
-- Register (or re-register) this worker process, fenced by its secret: a
-- row of that id under another secret is refused.
SELECT {schema}.register_worker(
    %(worker_id)s, %(token)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s,
    %(tasks)s::text[], %(version)s, %(pool)s);

-- name: worker_heartbeat
-- Mark the worker alive (re-registering it if a cleanup removed it); a
-- worker declared lost that speaks again is alive again. False: the row of
-- that id belongs to another process's secret (nothing changed).
SELECT {schema}.heartbeat_worker(
    %(worker_id)s, %(token)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s,
    %(tasks)s::text[], %(version)s, %(pool)s);

-- name: worker_deregister
-- Remove this worker's own row (a clean exit).
SELECT {schema}.deregister_worker(%(worker_id)s, %(token)s);
