-- The event stream of app.subscribe() (pgqueue/subscribe.py): read-only.

-- name: job_became_due
-- Scheduled jobs and retries that became due since %(since)s (the previous
-- call's clock; NULL: only the clock and the next due time), per queue: how
-- many (up to 1000 rows are looked at per call) and one job id; with the
-- database clock and when the next scheduled job is due. Range scans of the
-- scheduled-jobs index; workers stage such jobs to 'queued' when they next
-- lease, so the range holds few rows.
WITH clock AS (SELECT now() AS now),
due AS (
    SELECT j.queue, j.id, j.run_at
    FROM {schema}.jobs_live j, clock c
    WHERE j.stage = 'scheduled' AND j.run_at >= %(since)s::timestamptz AND j.run_at <= c.now
    ORDER BY j.run_at
    LIMIT 1000
)
SELECT c.now,
       (SELECT min(j.run_at) FROM {schema}.jobs_live j WHERE j.stage = 'scheduled' AND j.run_at > c.now)
           AS next_due,
       (SELECT max(d.run_at) FROM due d) AS last_due,
       (SELECT count(*) FROM due) AS looked_at,
       coalesce((SELECT jsonb_agg(jsonb_build_array(q.queue, q.n, q.job_id))
                 FROM (SELECT d.queue, count(*) AS n, min(d.id) AS job_id
                       FROM due d GROUP BY d.queue) q), '[]'::jsonb) AS queues
FROM clock c;
