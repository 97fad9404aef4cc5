-- Telemetry: traced enqueue, the lease with what metrics and traces need,
-- and the database view of `pgqueue metrics` (cheap reads: counts stop at
-- a cap, beyond which the planner's statistics give an estimate).

-- name: job_enqueue_batch_traced
-- enqueue_batch (enqueue_windowed when %(windowed)s), storing the trace
-- context (a JSON carrier) with every job.
SELECT job_id, created
FROM {schema}.enqueue_batch_traced(%(jobs)s::jsonb, %(trace_context)s::jsonb,
                                   %(windowed)s::boolean);

-- name: job_lease_observed
-- job_lease plus, for metrics and tracing, each job's wait (seconds: from
-- run_at to the attempt's start, lease_expires_at - lease_seconds) and trace
-- context: the same lease_jobs call, two more of its columns.
SELECT job_id, attempt_id, attempt, task, queue, payload, lease_expires_at, lease_seconds,
       extract(epoch FROM lease_expires_at - run_at)::float8 - lease_seconds AS wait_seconds,
       trace_context, tags, meta, group_key, priority,
       (extract(epoch FROM run_at) * 1000000)::bigint AS run_at_us, ordered
FROM {schema}.lease_jobs(%(queues)s::text[], %(worker_id)s, %(limit)s,
                         %(lease_seconds)s::integer, %(now)s::timestamptz, %(after)s::jsonb);

-- name: metrics_queue_live
-- Per queue: paused, ready and running counts (each an index range scan of
-- the queue's part of a partial index, stopping at the cap), oldest ready age.
SELECT q.name AS queue, q.paused,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_live j
            WHERE j.queue = q.name AND j.stage = 'queued' AND j.status = 'queued' LIMIT %(cap)s) c) AS queued,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_live j
            WHERE j.queue = q.name AND j.stage = 'queued' AND j.status = 'running' LIMIT %(cap)s) c) AS running,
       extract(epoch FROM now() - {schema}.queue_oldest_ready(q.name))::float8
           AS oldest_ready_age_seconds
FROM {schema}.queues q
ORDER BY q.name;

-- name: metrics_status_sample
-- Up to cap_<status> jobs of each other status, counted by queue (due
-- scheduled jobs count as queued), read in index order (scheduled by
-- run_at, finished ones newest first). One literal status per branch, so
-- that each scan ranges over its partial index. The caller passes a small
-- cap where the planner already expects far more rows than the cap: those
-- rows only give the per-queue shares of the planner's total.
SELECT s.status, s.queue, count(*)::bigint AS n
FROM (
    (SELECT CASE WHEN j.run_at <= now() THEN 'queued' ELSE 'scheduled' END AS status, j.queue
     FROM {schema}.jobs_live j WHERE j.stage = 'scheduled'
     ORDER BY j.run_at LIMIT %(cap_scheduled)s)
    UNION ALL
    (SELECT 'succeeded', j.queue FROM {schema}.jobs j WHERE j.status = 'succeeded'
     ORDER BY j.finished_at DESC LIMIT %(cap_succeeded)s)
    UNION ALL
    (SELECT 'dead', j.queue FROM {schema}.jobs j WHERE j.status = 'dead'
     ORDER BY j.finished_at DESC LIMIT %(cap_dead)s)
    UNION ALL
    (SELECT 'cancelled', j.queue FROM {schema}.jobs j WHERE j.status = 'cancelled'
     ORDER BY j.finished_at DESC LIMIT %(cap_cancelled)s)
) s
GROUP BY s.status, s.queue;

-- name: metrics_status_estimates
-- The planner's estimate of the jobs table's rows per stored status (from
-- ANALYZE statistics; empty before the first ANALYZE).
-- Live jobs: jobs_live's rows times each status's share; finished ones:
-- the rows of their partition's leaves.
SELECT v.status, round(c.reltuples * v.freq)::bigint AS estimate
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_stats s
  ON s.schemaname = n.nspname AND s.tablename = 'jobs_live' AND s.attname = 'status'
CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(status, freq)
WHERE c.oid = '{schema}.jobs_live'::regclass AND c.reltuples > 0
UNION ALL
SELECT substr(p.relname::text, 6), sum(c.reltuples)::bigint
FROM pg_catalog.pg_class p
JOIN pg_catalog.pg_inherits i ON i.inhparent = p.oid
JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
WHERE p.oid IN ('{schema}.jobs_succeeded'::regclass, '{schema}.jobs_dead'::regclass,
                '{schema}.jobs_cancelled'::regclass)
  AND c.reltuples > 0
GROUP BY p.relname;

-- name: metrics_workers_alive
-- Registered workers whose heartbeat is younger than %(seconds)s.
SELECT count(*)::bigint FROM {schema}.workers
WHERE last_heartbeat_at > now() - make_interval(secs => %(seconds)s);
