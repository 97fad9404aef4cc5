-- Task registry (published by workers), live task settings and limits (set
-- by operators), task statistics, and the lifecycle of lost workers.

-- name: task_publish
-- A worker publishes the tasks it runs: name, declared queue and defaults.
SELECT {schema}.publish_tasks(
    %(worker_id)s, %(names)s::text[], %(queues)s::text[], %(priorities)s::smallint[],
    %(max_attempts)s::integer[], %(lease_seconds)s::integer[], %(timeouts)s::float8[],
    %(b1)s::real[], %(b2)s::real[], %(b3)s::real[], %(b4)s::real[]);

-- name: task_settings_all
-- Every operator setting (the worker's cache of live settings).
SELECT name, max_attempts, lease_seconds, timeout_seconds, priority, backoff,
       concurrency_limit, rate_limit, extract(epoch FROM rate_period)::float8 AS rate_period_seconds,
       updated_at
FROM {schema}.task_settings ORDER BY name;

-- name: task_settings_upsert
-- Set (or, with NULL and the field named in %(clear)s, unset) live settings of
-- a task; a row left with nothing set is deleted. Workers are told by NOTIFY.
WITH upserted AS (
    INSERT INTO {schema}.task_settings AS s
        (name, max_attempts, lease_seconds, timeout_seconds, priority, backoff)
    VALUES (%(name)s, %(max_attempts)s, %(lease_seconds)s, %(timeout_seconds)s, %(priority)s,
            %(backoff)s::real[])
    ON CONFLICT (name) DO UPDATE
    SET max_attempts = CASE WHEN 'max_attempts' = ANY (%(clear)s::text[]) THEN NULL
                            ELSE coalesce(EXCLUDED.max_attempts, s.max_attempts) END,
        lease_seconds = CASE WHEN 'lease_seconds' = ANY (%(clear)s::text[]) THEN NULL
                             ELSE coalesce(EXCLUDED.lease_seconds, s.lease_seconds) END,
        timeout_seconds = CASE WHEN 'timeout' = ANY (%(clear)s::text[]) THEN NULL
                               ELSE coalesce(EXCLUDED.timeout_seconds, s.timeout_seconds) END,
        priority = CASE WHEN 'priority' = ANY (%(clear)s::text[]) THEN NULL
                        ELSE coalesce(EXCLUDED.priority, s.priority) END,
        backoff = CASE WHEN 'retry' = ANY (%(clear)s::text[]) THEN NULL
                       ELSE coalesce(EXCLUDED.backoff, s.backoff) END,
        updated_at = now()
    RETURNING s.name
), notified AS (
    SELECT pg_notify({channel}, 't:' || name) FROM upserted
)
SELECT name FROM upserted CROSS JOIN notified;

-- name: task_limits_set
-- Set a task's concurrency and rate limits (NULL lifts a limit).
WITH upserted AS (
    INSERT INTO {schema}.task_settings AS s (name, concurrency_limit, rate_limit, rate_period)
    VALUES (%(name)s, %(concurrency)s, %(rate_limit)s, %(rate_period)s)
    ON CONFLICT (name) DO UPDATE
    SET concurrency_limit = EXCLUDED.concurrency_limit, rate_limit = EXCLUDED.rate_limit,
        rate_period = EXCLUDED.rate_period, updated_at = now()
    RETURNING s.name
), notified AS (
    -- Workers lease again: a raised limit frees slots now.
    SELECT pg_notify({channel}, 't:' || name) FROM upserted
)
SELECT name FROM upserted CROSS JOIN notified;

-- name: task_settings_prune
-- Forget a settings row that no longer sets anything.
DELETE FROM {schema}.task_settings
WHERE name = %(name)s AND max_attempts IS NULL AND lease_seconds IS NULL
  AND timeout_seconds IS NULL AND priority IS NULL AND backoff IS NULL
  AND concurrency_limit IS NULL AND rate_limit IS NULL;

-- name: task_list
-- Every task known to the database (published by a worker, or with settings):
-- declared defaults, live settings, limits, live workers that have it, and
-- its running count. %(name)s NULL: all tasks.
WITH names AS (
    SELECT name FROM {schema}.tasks
    UNION
    SELECT name FROM {schema}.task_settings
)
SELECT n.name, t.queue, t.priority, t.max_attempts, t.lease_seconds, t.timeout_seconds,
       t.backoff, t.published_by, t.first_seen_at, t.last_seen_at,
       s.max_attempts AS set_max_attempts, s.lease_seconds AS set_lease_seconds,
       s.timeout_seconds AS set_timeout_seconds, s.priority AS set_priority,
       s.backoff AS set_backoff, s.concurrency_limit, s.rate_limit,
       extract(epoch FROM s.rate_period)::float8 AS rate_period_seconds,
       coalesce((SELECT array_agg(w.id ORDER BY w.id) FROM {schema}.workers w
                 WHERE n.name = ANY (w.tasks) AND w.lost_at IS NULL
                   AND w.last_heartbeat_at > now() - make_interval(secs => %(alive_seconds)s)),
                '{}') AS workers,
       (SELECT count(*) FROM {schema}.jobs_live j
        WHERE j.task = n.name AND j.stage = 'queued' AND j.status = 'running') AS running
FROM names n
LEFT JOIN {schema}.tasks t ON t.name = n.name
LEFT JOIN {schema}.task_settings s ON s.name = n.name
WHERE %(name)s::text IS NULL OR n.name = %(name)s::text
ORDER BY n.name;

-- name: task_wait_context
-- Why a live job of a task may wait on the task: its limits, running count
-- and recent leases, and whether any live worker knows the task.
SELECT s.concurrency_limit AS concurrency_limit_of_task, s.rate_limit AS rate_limit_of_task,
       extract(epoch FROM s.rate_period)::float8 AS rate_period_of_task_seconds,
       (SELECT count(*) FROM {schema}.jobs_live r WHERE r.task = %(task)s AND r.stage = 'queued' AND r.status = 'running'
          AND r.lease_expires_at > now()) AS running_of_task,
       (SELECT count(*) FROM {schema}.task_lease_log l WHERE l.task = %(task)s
          AND l.leased_at > now() - s.rate_period) AS task_leases_in_window,
       (SELECT count(*) FROM {schema}.workers w
        WHERE w.lost_at IS NULL
          AND w.last_heartbeat_at > now() - make_interval(secs => %(alive_seconds)s)) AS live_workers,
       (SELECT count(*) FROM {schema}.workers w
        WHERE %(task)s = ANY (w.tasks) AND w.lost_at IS NULL
          AND w.last_heartbeat_at > now() - make_interval(secs => %(alive_seconds)s))
           AS live_workers_with_task
FROM (SELECT 1) one
LEFT JOIN {schema}.task_settings s ON s.name = %(task)s;

-- name: task_unknown_waiting
-- Live jobs of tasks that no live worker knows, found through the hand-backs
-- that flag them (a worker without the task records a 'released' attempt
-- with error_code 'unknown_task' at most ~75 s apart while the job waits):
-- an index range over the last 10 minutes of attempts, then primary-key
-- lookups, whatever the size of the queues. One row per task: how many
-- jobs and the oldest one's age. For status and doctor.
WITH flagged AS (
    SELECT DISTINCT a.job_id FROM {schema}.job_attempts a
    WHERE a.finished_at > now() - interval '10 minutes'
      AND a.error_code = 'unknown_task' AND a.outcome = 'released'
)
SELECT j.task, count(*) AS jobs,
       extract(epoch FROM now() - min(j.created_at))::float8 AS oldest_age_seconds
FROM flagged f
JOIN {schema}.jobs_live j ON j.id = f.job_id
WHERE j.stage IN ('queued', 'scheduled') AND j.status <> 'running'
  AND NOT EXISTS (SELECT 1 FROM {schema}.workers w
                  WHERE j.task = ANY (w.tasks) AND w.lost_at IS NULL
                    AND w.last_heartbeat_at > now() - make_interval(secs => %(alive_seconds)s))
GROUP BY j.task
ORDER BY min(j.created_at);

-- name: task_stats_window
-- Where a statistics window over at most %(sample)s finished jobs starts:
-- %(since)s, or the finish of the %(sample)s-th newest job finished since
-- then when more did (a merge of the finished indexes' ranges, newest
-- first: bounded however busy the system is).
SELECT CASE WHEN count(*) < %(sample)s::integer THEN %(since)s::timestamptz
            ELSE min(n.finished_at) END AS since
FROM (
    SELECT u.finished_at FROM (
        (SELECT j.finished_at FROM {schema}.jobs j
         WHERE j.status = 'succeeded' AND j.finished_at >= %(since)s
         ORDER BY j.finished_at DESC LIMIT %(sample)s)
        UNION ALL
        (SELECT j.finished_at FROM {schema}.jobs j
         WHERE j.status = 'dead' AND j.finished_at >= %(since)s
         ORDER BY j.finished_at DESC LIMIT %(sample)s)
        UNION ALL
        (SELECT j.finished_at FROM {schema}.jobs j
         WHERE j.status = 'cancelled' AND j.finished_at >= %(since)s
         ORDER BY j.finished_at DESC LIMIT %(sample)s)
        UNION ALL
        (SELECT a.finished_at FROM {schema}.jobs_archive a
         WHERE a.finished_at >= %(since)s
         ORDER BY a.finished_at DESC LIMIT %(sample)s)
    ) u
    ORDER BY u.finished_at DESC
    LIMIT %(sample)s
) n;

-- name: task_stats
-- Per-task run statistics over jobs finished (or attempts ended) since
-- %(since)s, from the hot table, its attempts and the archive; each scan is
-- an index range on finished_at. Durations: start of the last attempt to
-- finish; wait: run_at to start of the last attempt.
WITH finished AS (
    -- One literal status per branch: jobs_finished_idx leads with status and
    -- its predicate implies an IN list, which the planner would then drop
    -- from the index condition (a scan of the whole index or table).
    SELECT j.task, 'succeeded' AS status, j.attempts, j.last_error, j.finished_at,
           extract(epoch FROM j.finished_at - j.attempt_started_at)::float8 AS duration,
           extract(epoch FROM j.attempt_started_at - j.run_at)::float8 AS wait
    FROM {schema}.jobs j
    WHERE j.status = 'succeeded' AND j.finished_at >= %(since)s
      AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
    UNION ALL
    SELECT j.task, 'dead', j.attempts, j.last_error, j.finished_at,
           extract(epoch FROM j.finished_at - j.attempt_started_at)::float8,
           extract(epoch FROM j.attempt_started_at - j.run_at)::float8
    FROM {schema}.jobs j
    WHERE j.status = 'dead' AND j.finished_at >= %(since)s
      AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
    UNION ALL
    SELECT j.task, 'cancelled', j.attempts, j.last_error, j.finished_at,
           extract(epoch FROM j.finished_at - j.attempt_started_at)::float8,
           extract(epoch FROM j.attempt_started_at - j.run_at)::float8
    FROM {schema}.jobs j
    WHERE j.status = 'cancelled' AND j.finished_at >= %(since)s
      AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
    UNION ALL
    SELECT a.task, a.status::text, a.attempts, a.last_error, a.finished_at,
           extract(epoch FROM a.finished_at - a.attempt_started_at)::float8,
           extract(epoch FROM a.attempt_started_at - a.run_at)::float8
    FROM {schema}.jobs_archive a
    WHERE a.finished_at >= %(since)s
      AND (%(task)s::text IS NULL OR a.task = %(task)s::text)
), failed_attempts AS (
    SELECT j.task, count(*) FILTER (WHERE a.outcome IN ('failed', 'retry', 'timeout', 'lease_expired'))
               AS failed,
           count(*) FILTER (WHERE a.outcome NOT IN ('released', 'running')) AS runs,  -- that ran
           (array_agg(a.error_code || ': ' || coalesce(a.error_message, '')
                      ORDER BY a.finished_at DESC)
               FILTER (WHERE a.error_code IS NOT NULL))[1] AS last_error,
           max(a.finished_at) FILTER (WHERE a.error_code IS NOT NULL) AS last_error_at
    FROM {schema}.job_attempts a
    JOIN LATERAL (
        SELECT x.task FROM {schema}.jobs x WHERE x.id = a.job_id
        UNION ALL
        SELECT y.task FROM {schema}.jobs_archive y WHERE y.id = a.job_id
        LIMIT 1
    ) j ON true
    WHERE a.finished_at >= %(since)s
      AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
    GROUP BY j.task
), per_task AS (
    SELECT f.task,
           count(*) FILTER (WHERE f.status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE f.status = 'dead') AS dead,
           count(*) FILTER (WHERE f.status = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE f.status = 'succeeded' AND f.attempts > 1) AS succeeded_after_retry,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY f.duration) AS duration_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY f.duration) AS duration_p95,
           max(f.duration) AS duration_max,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY f.wait) AS wait_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY f.wait) AS wait_p95,
           max(f.wait) AS wait_max,
           (array_agg(f.last_error ORDER BY f.finished_at DESC)
               FILTER (WHERE f.status = 'dead' AND f.last_error IS NOT NULL))[1] AS last_dead_error,
           max(f.finished_at) FILTER (WHERE f.status = 'dead') AS last_dead_at
    FROM finished f
    GROUP BY f.task
)
SELECT coalesce(p.task, a.task) AS task,
       coalesce(p.succeeded, 0) + coalesce(a.runs, 0) AS runs,
       coalesce(p.succeeded, 0) AS succeeded,
       coalesce(a.failed, 0) AS failed,
       coalesce(p.dead, 0) AS dead,
       coalesce(p.cancelled, 0) AS cancelled,
       -- a dead job's last failed attempt was not retried
       greatest(coalesce(a.failed, 0) - coalesce(p.dead, 0), 0) AS retries,
       p.duration_p50, p.duration_p95, p.duration_max, p.wait_p50, p.wait_p95, p.wait_max,
       CASE WHEN a.last_error_at IS NULL OR (p.last_dead_at IS NOT NULL AND p.last_dead_at >= a.last_error_at)
            THEN coalesce(p.last_dead_error, a.last_error) ELSE a.last_error END AS last_error,
       %(since)s::timestamptz AS window_start
FROM per_task p
FULL JOIN failed_attempts a ON a.task = p.task
ORDER BY 1;

-- name: worker_mark_lost
-- Declare workers silent for longer than %(seconds)s (at least 60) lost, with when.
SELECT id FROM {schema}.mark_lost_workers(%(seconds)s) AS id;

-- name: worker_prune_lost
-- Forget workers lost for longer than %(seconds)s whose jobs were all reaped.
SELECT id FROM {schema}.prune_lost_workers(%(seconds)s) AS id;

-- name: worker_forget
-- Forget a worker (pgqueue workers forget): refused while it is alive
-- (heartbeat within %(seconds)s) unless forced. Returns the id when removed.
DELETE FROM {schema}.workers w
WHERE w.id = %(worker_id)s
  AND (%(force)s OR w.lost_at IS NOT NULL
       OR w.last_heartbeat_at < now() - make_interval(secs => %(seconds)s))
RETURNING w.id;

-- name: worker_list_states
-- Workers with their state: alive, stale (heartbeat late) or lost (with
-- when), their pgqueue version, their pool, their tasks and how many jobs they hold.
SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.tasks, w.version, w.pool, w.started_at,
       w.last_heartbeat_at, w.lost_at,
       extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS heartbeat_age_seconds,
       CASE WHEN w.lost_at IS NOT NULL THEN 'lost'
            WHEN w.last_heartbeat_at < now() - make_interval(secs => %(seconds)s) THEN 'stale'
            ELSE 'alive' END AS state,
       (SELECT count(*) FROM {schema}.jobs_live j
        WHERE j.stage = 'queued' AND j.status = 'running' AND j.worker_id = w.id) AS running
FROM {schema}.workers w
ORDER BY w.started_at;
