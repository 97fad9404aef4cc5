-- Job administration: replay, requeue dead jobs, queue pause and limits
-- (pgqueue/ops/admin.py). Reads are in inspect.sql, bulk actions in operator.sql.

-- name: job_replay
-- Enqueue a copy of a job (any state, hot or archived), optionally into
-- another queue or at another time: replay_job (sql/schema.sql), which only the
-- schema's owner and admins may execute. Returns (job_id, created) like
-- enqueue; no row when the job does not exist.
SELECT job_id, created FROM {schema}.replay_job(%(job_id)s, %(queue)s::text, %(run_at)s::timestamptz);

-- name: job_requeue_dead
-- Dead jobs back to queued now, with one more attempt allowed when their
-- attempts are used up. Selects by ids, or by queue/task filters when ids is
-- NULL, at most %(limit)s per call. A dead job whose dedup key is live again
-- (or repeated among the selected) is skipped. Returns the requeued ids.
WITH candidates AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs_dead j
    WHERE (%(job_ids)s::bigint[] IS NULL OR j.id = ANY (%(job_ids)s::bigint[]))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
      AND (j.dedup_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM {schema}.jobs_live o
                        WHERE o.queue = j.queue AND o.dedup_key = j.dedup_key
                          AND o.stage IN ('queued', 'scheduled'))
            AND NOT EXISTS (SELECT 1 FROM {schema}.jobs_dead o
                            WHERE o.queue = j.queue AND o.dedup_key = j.dedup_key AND o.id < j.id
                              AND (%(job_ids)s::bigint[] IS NULL
                                   OR o.id = ANY (%(job_ids)s::bigint[])))))
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), requeued AS (
    -- The row moves back to jobs_live.
    UPDATE {schema}.jobs j
    SET status = 'queued', run_at = now(), finished_at = NULL, cancel_requested = false,
        max_attempts = greatest(j.max_attempts, j.attempts + 1)
    WHERE j.status = 'dead' AND j.id = ANY (ARRAY(SELECT id FROM candidates))
    RETURNING j.id, j.queue, j.priority, j.run_at
), notified AS (
    SELECT count(pg_notify({channel}, 'j:' || q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM requeued) q
), announced AS (
    SELECT count({schema}.announce_ready(f.queue, f.priority, f.run_at, f.id)) AS n
    FROM (SELECT DISTINCT ON (r.queue) r.queue, r.priority, r.run_at, r.id
          FROM requeued r ORDER BY r.queue, r.priority DESC, r.run_at, r.id) f
)
SELECT r.id FROM requeued r CROSS JOIN notified CROSS JOIN announced;

-- name: queue_set_paused
-- Pause or resume a queue (creating its row if needed); workers and
-- subscribers are told ('p:<queue>' paused, 'r:<queue>' resumed).
WITH upserted AS (
    INSERT INTO {schema}.queues AS q (name, paused) VALUES (%(queue)s, %(paused)s)
    ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
    RETURNING q.name, q.paused
)
SELECT u.name, pg_notify({channel}, CASE WHEN u.paused THEN 'p:' ELSE 'r:' END || u.name) IS NULL
FROM upserted u;

-- name: queue_set_limits
-- Set a queue's global concurrency and rate limits (NULL lifts a limit).
WITH upserted AS (
    INSERT INTO {schema}.queues AS q (name, concurrency_limit, rate_limit, rate_period)
    VALUES (%(queue)s, %(concurrency)s, %(rate_limit)s, make_interval(secs => %(rate_period)s))
    ON CONFLICT (name) DO UPDATE
    SET concurrency_limit = EXCLUDED.concurrency_limit, rate_limit = EXCLUDED.rate_limit,
        rate_period = EXCLUDED.rate_period, updated_at = now()
    RETURNING q.name
)
SELECT u.name, pg_notify({channel}, 'q:' || u.name) IS NULL FROM upserted u;
