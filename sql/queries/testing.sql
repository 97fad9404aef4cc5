-- Reads of pgqueue.testing.drain: which job a drain runs next, and how an
-- attempt it ran ended. Read-only: the drain leases, completes and hands
-- back jobs with the worker's own statements.

-- name: drain_clock
-- The server's wall clock when a drain begins (its "due by" time).
SELECT clock_timestamp();

-- name: drain_queue_heads
-- The queues of %(queues)s (NULL: every queue) that are not paused and hold
-- a ready job the drain may run: one due when the drain began (run_at at or
-- before %(since)s) or when it was enqueued (run_at at or before created_at:
-- a job enqueued for now while the drain runs). A retry, a snooze or a
-- delayed job that became due since is ready but not the drain's. Per
-- queue: its first ready job in lease order (priority, run_at, id) and
-- whether that one is the drain's; queues whose first job is come first,
-- in lease order.
-- Ready: queued, or scheduled and due (the next lease queues it); each part
-- reads its own index (jobs_ready_idx, jobs_scheduled_idx).
WITH ready AS MATERIALIZED (
    SELECT q.name AS queue, h.due, h.priority, h.run_at, h.id
    FROM {schema}.queues q
    CROSS JOIN LATERAL (
        SELECT c.run_at <= greatest(%(since)s::timestamptz, c.created_at) AS due,
               c.priority, c.run_at, c.id
        FROM (
            (SELECT j.priority, j.run_at, j.id, j.created_at FROM {schema}.jobs_live j
             WHERE j.queue = q.name AND j.stage = 'queued' AND NOT j.serial_held
               AND j.status = 'queued' AND j.run_at <= now()
             ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
            UNION ALL
            (SELECT j.priority, j.run_at, j.id, j.created_at FROM {schema}.jobs_live j
             WHERE j.stage = 'scheduled' AND j.run_at <= now() AND j.queue = q.name
             ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
        ) c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT 1
    ) h
    WHERE NOT q.paused
      AND (%(queues)s::text[] IS NULL OR q.name = ANY (%(queues)s::text[]))
)
SELECT r.queue, r.id, r.due
FROM ready r
WHERE r.due
   OR EXISTS (SELECT 1 FROM {schema}.jobs_live j
              WHERE j.queue = r.queue AND j.stage = 'queued' AND NOT j.serial_held
                AND j.status = 'queued'
                AND j.run_at <= greatest(%(since)s::timestamptz, j.created_at))
   OR EXISTS (SELECT 1 FROM {schema}.jobs_live j
              WHERE j.stage = 'scheduled' AND j.run_at <= now() AND j.queue = r.queue
                AND j.run_at <= greatest(%(since)s::timestamptz, j.created_at))
ORDER BY NOT r.due, r.priority DESC, r.run_at, r.id;

-- name: drain_job_due
-- Whether job %(job_id)s is the drain's (see drain_queue_heads): due by
-- %(since)s or when it was enqueued. No row: the job is gone.
SELECT run_at <= greatest(%(since)s::timestamptz, created_at)
FROM {schema}.jobs WHERE id = %(job_id)s::bigint;

-- name: attempt_outcomes
-- The recorded outcome of each of the given attempts (by attempt id).
SELECT id, outcome::text FROM {schema}.job_attempts WHERE id = ANY (%(attempt_ids)s::bigint[]);
