-- Hot-path statements: enqueue, lease, complete, extend.
-- Every completion matches on (id, attempt_id, status = 'running'): a holder
-- whose lease was reaped and re-leased presents an old attempt id and matches
-- nothing, so a late result can never overwrite a newer attempt.

-- name: job_enqueue_batch
-- Enqueue a JSON array of job objects; one row (job_id, created) per input, in order.
SELECT job_id, created FROM {schema}.enqueue_batch(%(jobs)s::jsonb);

-- name: job_enqueue_windowed
-- Enqueue a JSON array of job objects some of which carry dedup_window or
-- debounce (seconds); one row (job_id, created) per input, in order.
SELECT job_id, created FROM {schema}.enqueue_windowed(%(jobs)s::jsonb);

-- name: job_lease
-- Lease up to %(limit)s jobs of the given queues (NULL: all) for a worker.
SELECT job_id, attempt_id, attempt, task, queue, payload, lease_expires_at, lease_seconds
FROM {schema}.lease_jobs(%(queues)s::text[], %(worker_id)s, %(limit)s,
                         %(lease_seconds)s::integer, %(now)s::timestamptz);

-- name: job_ack_many
-- Finish leased jobs successfully (cancelled if a cancel was requested while
-- they ran). Returns the (id, attempt_id) pairs that still held their lease.
-- A result that could not be stored leaves result NULL and says why in last_error.
WITH done AS (
    SELECT * FROM unnest(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(results)s::jsonb[],
                         %(result_errors)s::text[])
        AS d(job_id, attempt_id, result, result_error)
), finished AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'succeeded' END::{schema}.job_status,
        finished_at = coalesce(%(now)s::timestamptz, now()),
        lease_expires_at = NULL,
        result = CASE WHEN j.cancel_requested THEN NULL ELSE d.result END,
        last_error = CASE WHEN j.cancel_requested THEN j.last_error
                          ELSE coalesce(d.result_error, j.last_error) END
    FROM done d
    WHERE j.id = ANY (%(job_ids)s::bigint[])  -- primary-key lookups, not a scan of running jobs
      AND j.id = d.job_id AND j.attempt_id = d.attempt_id AND j.status = 'running'
    RETURNING j.id, j.status, j.notify_finish, j.attempt_id, j.attempts, j.worker_id,
              j.attempt_started_at, j.finished_at, j.queue
), cancelled_attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id, error_code, error_message)
    SELECT f.attempt_id, f.id, f.attempts, 'cancelled', f.attempt_started_at, f.finished_at,
           f.worker_id, 'cancelled', 'cancelled while running'
    FROM finished f WHERE f.status = 'cancelled'
), notified AS (
    -- Finished: tell result() waiters; a freed slot of a concurrency-limited
    -- queue: tell its workers (unlimited queues send nothing here).
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || f.id || ':' || f.status || ':' || f.queue AS payload
          FROM finished f WHERE f.notify_finish
          UNION
          SELECT DISTINCT 'w:' || f.queue FROM finished f
          WHERE f.queue IN (SELECT name FROM {schema}.queues WHERE concurrency_limit IS NOT NULL)) n
)
SELECT f.id, f.attempt_id FROM finished f CROSS JOIN notified;

-- name: job_fail_many
-- Record failed attempts: requeue with the given retry time or the job's
-- backoff, or dead-letter (permanent, or attempts exhausted), or cancel (a
-- cancel was requested). Returns (id, attempt_id, status) of the attempts that held their lease.
WITH failed AS (
    SELECT * FROM unnest(
        %(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(outcomes)s::{schema}.attempt_outcome[],
        %(retry_ats)s::timestamptz[], %(retry_delays)s::float8[], %(permanent)s::boolean[],
        %(error_codes)s::text[], %(error_messages)s::text[], %(tracebacks)s::text[])
        AS f(job_id, attempt_id, outcome, retry_at, retry_delay, permanent, error_code,
             error_message, traceback)
), decided AS (
    SELECT f.*, j.attempts, j.attempt_started_at, j.worker_id, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                WHEN f.permanent OR j.attempts >= j.max_attempts THEN 'dead'
                ELSE 'retry' END AS next,
           coalesce(f.retry_at, coalesce(%(now)s::timestamptz, now()) + coalesce(
               make_interval(secs => f.retry_delay),
               {schema}.retry_delay(j.attempts, j.backoff_base, j.backoff_factor,
                                    j.backoff_max, j.backoff_jitter))) AS next_run_at
    FROM failed f
    JOIN {schema}.jobs j ON j.id = f.job_id AND j.attempt_id = f.attempt_id AND j.status = 'running'
    WHERE j.id = ANY (%(job_ids)s::bigint[])
    FOR UPDATE OF j
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE d.next
            WHEN 'retry' THEN CASE WHEN d.next_run_at > coalesce(%(now)s::timestamptz, now())
                                   THEN 'scheduled' ELSE 'queued' END
            ELSE d.next END::{schema}.job_status,
        run_at = CASE WHEN d.next = 'retry' THEN d.next_run_at ELSE j.run_at END,
        finished_at = CASE WHEN d.next = 'retry' THEN NULL
                           ELSE coalesce(%(now)s::timestamptz, now()) END,
        lease_expires_at = NULL,
        last_error = left(d.error_code || ': ' || coalesce(d.error_message, ''), 2000)
    FROM decided d
    WHERE j.id = ANY (%(job_ids)s::bigint[]) AND j.id = d.job_id
    RETURNING j.id, j.attempt_id, j.status, j.queue
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id,
         error_code, error_message, traceback)
    SELECT d.attempt_id, d.job_id, d.attempts,
           CASE WHEN d.next = 'cancelled' THEN 'cancelled' ELSE d.outcome END,
           d.attempt_started_at, coalesce(%(now)s::timestamptz, now()), d.worker_id,
           d.error_code, d.error_message, d.traceback
    FROM decided d
), notified AS (
    -- Finished: tell result() waiters. Retried now: new ready work; retried
    -- later or a freed slot: the queue's workers recompute when to wake.
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || u.id || ':' || u.status || ':' || u.queue AS payload
          FROM decided d JOIN updated u ON u.id = d.job_id
          WHERE d.notify_finish AND d.next <> 'retry'
          UNION
          SELECT DISTINCT 'j:' || u.queue FROM updated u WHERE u.status = 'queued'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u
          WHERE u.status = 'scheduled'
             OR u.queue IN (SELECT name FROM {schema}.queues WHERE concurrency_limit IS NOT NULL)) n
)
SELECT u.id, u.attempt_id, u.status::text FROM updated u CROSS JOIN notified;

-- name: job_nack_many
-- Hand leased jobs back unrun: queued again at their old place, the attempt
-- recorded as 'released' and not counted. Returns the ids that held their lease.
WITH released AS (
    SELECT * FROM unnest(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[])
        AS r(job_id, attempt_id)
), old AS (
    SELECT j.id, j.attempt_id, j.attempts, j.attempt_started_at, j.worker_id, j.cancel_requested
    FROM {schema}.jobs j JOIN released r ON j.id = r.job_id AND j.attempt_id = r.attempt_id
    WHERE j.id = ANY (%(job_ids)s::bigint[]) AND j.status = 'running'
    FOR UPDATE OF j
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN o.cancel_requested THEN 'cancelled' ELSE 'queued' END::{schema}.job_status,
        attempts = CASE WHEN o.cancel_requested THEN j.attempts ELSE j.attempts - 1 END,
        finished_at = CASE WHEN o.cancel_requested THEN coalesce(%(now)s::timestamptz, now()) END,
        lease_expires_at = NULL
    FROM old o
    WHERE j.id = ANY (%(job_ids)s::bigint[]) AND j.id = o.id
    RETURNING j.id, j.attempt_id, j.status, j.queue
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id)
    SELECT o.attempt_id, o.id, o.attempts,
           CASE WHEN o.cancel_requested THEN 'cancelled' ELSE 'released' END::{schema}.attempt_outcome,
           o.attempt_started_at, coalesce(%(now)s::timestamptz, now()), o.worker_id
    FROM old o
), notified AS (
    SELECT count(pg_notify({channel}, 'j:' || q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM updated WHERE status = 'queued') q
)
SELECT u.id, u.attempt_id FROM updated u CROSS JOIN notified;

-- name: job_extend_many
-- Heartbeat: push the leases of running jobs to now + seconds. Returns, for
-- every job that still holds its lease, whether a cancel was requested;
-- jobs missing from the result have lost their lease.
UPDATE {schema}.jobs j
SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => e.seconds)
FROM unnest(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(seconds)s::float8[])
    AS e(job_id, attempt_id, seconds)
WHERE j.id = ANY (%(job_ids)s::bigint[])
  AND j.id = e.job_id AND j.attempt_id = e.attempt_id AND j.status = 'running'
RETURNING j.id, j.cancel_requested;

-- name: job_cancel_flags
-- Which of these running attempts have been asked to stop, and which lost their lease.
SELECT c.job_id, j.cancel_requested,
       (j.id IS NOT NULL AND j.status = 'running' AND j.attempt_id = c.attempt_id) AS held
FROM unnest(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[]) AS c(job_id, attempt_id)
LEFT JOIN {schema}.jobs j ON j.id = c.job_id;

-- name: job_next_due
-- Seconds until the earliest scheduled job becomes due or a full rate-limit
-- window of one of these queues (NULL: all) frees a slot; NULL when neither.
-- On the server's clock so that client clock skew does not matter.
SELECT extract(epoch FROM least(
    (SELECT min(run_at) FROM {schema}.jobs WHERE status = 'scheduled'),
    (SELECT min(w.next_slot) FROM (
        SELECT min(l.leased_at) + q.rate_period AS next_slot
        FROM {schema}.queues q
        JOIN {schema}.queue_lease_log l
          ON l.queue = q.name AND l.leased_at > now() - q.rate_period
        WHERE q.rate_limit IS NOT NULL
          AND (%(queues)s::text[] IS NULL OR q.name = ANY (%(queues)s::text[]))
        GROUP BY q.name, q.rate_limit, q.rate_period
        HAVING count(*) >= q.rate_limit) w)
) - now())::float8;

-- name: job_watch_finish
-- Ask for a notification when a live job finishes. No row: the job is not
-- live (or already watched); read it with job_result.
UPDATE {schema}.jobs SET notify_finish = true
WHERE id = %(job_id)s AND status IN ('queued', 'scheduled', 'running') AND NOT notify_finish
RETURNING status::text;

-- name: job_result
-- A job's status, stored result and last error, from the hot table or the archive.
SELECT status::text, result, last_error FROM {schema}.jobs WHERE id = %(job_id)s
UNION ALL
SELECT status::text, result, last_error FROM {schema}.jobs_archive WHERE id = %(job_id)s
LIMIT 1;
