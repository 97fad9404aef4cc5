-- Reads of jobs and queues for pgqueue/ops/inspect.py (get_job, the job
-- lists, metrics, explain, count_dead).

-- name: job_get
-- One job, from the hot table or the archive, with the facts `explain` needs.
SELECT j.id, j.queue, j.task, j.payload, j.priority,
       {schema}.visible_status(j.status, j.run_at) AS status,
       j.run_at, j.attempts, j.max_attempts, j.dedup_key, j.serial_key, j.created_at,
       j.finished_at, j.last_error, j.result,
       j.status::text AS stored_status, j.attempt_id, j.worker_id, j.attempt_started_at,
       j.lease_expires_at, j.cancel_requested, j.lease_seconds, false AS archived, now() AS db_now,
       coalesce(j.tags, '{}') AS tags, j.meta, j.progress, j.snoozes, j.group_key
FROM {schema}.jobs j WHERE j.id = %(job_id)s
UNION ALL
SELECT a.id, a.queue, a.task, a.payload, a.priority, a.status::text, a.run_at, a.attempts,
       a.max_attempts, a.dedup_key, a.serial_key, a.created_at, a.finished_at, a.last_error,
       a.result, a.status::text, a.attempt_id, a.worker_id, a.attempt_started_at,
       a.lease_expires_at, a.cancel_requested, a.lease_seconds, true, now(),
       coalesce(a.tags, '{}'), a.meta, a.progress, a.snoozes, a.group_key
FROM {schema}.jobs_archive a WHERE a.id = %(job_id)s
LIMIT 1;

-- name: job_attempt_history
-- Every attempt of a job, oldest first: finished ones from job_attempts, the
-- running or final successful one from the job row itself.
SELECT attempt, attempt_id, worker_id, started_at, finished_at, outcome, error_code,
       error_message, traceback,
       (extract(epoch FROM finished_at - started_at) * 1000)::float8 AS latency_ms
FROM (
    SELECT a.attempt, a.id AS attempt_id, a.worker_id, a.started_at, a.finished_at,
           a.outcome::text AS outcome, a.error_code, a.error_message, a.traceback
    FROM {schema}.job_attempts a WHERE a.job_id = %(job_id)s
    UNION ALL
    SELECT j.attempts, j.attempt_id, j.worker_id, j.attempt_started_at,
           CASE WHEN j.status = 'succeeded' THEN j.finished_at END,
           j.status::text, NULL, NULL, NULL
    FROM {schema}.jobs j
    WHERE j.id = %(job_id)s AND j.status IN ('running', 'succeeded') AND j.attempt_id IS NOT NULL
    UNION ALL
    SELECT j.attempts, j.attempt_id, j.worker_id, j.attempt_started_at, j.finished_at,
           'succeeded', NULL, NULL, NULL
    FROM {schema}.jobs_archive j
    WHERE j.id = %(job_id)s AND j.status = 'succeeded' AND j.attempt_id IS NOT NULL
) h
ORDER BY attempt_id;

-- name: job_list
-- The job lists: a page of jobs, newest first, keyset-paginated on id; every
-- filter optional. `list_jobs`, `pgqueue jobs list` and the dashboard's lists
-- (ops/inspect.py job_page) all read jobs here, or, in the order of their
-- finish, in job_list_finished.
-- %(stored_statuses)s narrows to storage states, %(due)s then picks
-- queued (true) or scheduled (false) among queued/scheduled rows.
-- A search passes %(pattern)s (free text over payload and last error) with
-- the window of ids job_list_window found, %(min_id)s to %(before_id)s,
-- which bounds what it reads however rare the text is.
SELECT j.id, j.queue, j.task, j.payload, j.priority,
       {schema}.visible_status(j.status, j.run_at) AS status,
       j.run_at, j.attempts, j.max_attempts, j.dedup_key, j.serial_key, j.created_at,
       j.finished_at, j.last_error, j.result,
       coalesce(j.tags, '{}') AS tags, j.meta, j.progress, j.snoozes, j.group_key
FROM {schema}.jobs j
WHERE (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
  AND (%(group_key)s::text IS NULL OR j.group_key = %(group_key)s::text)
  -- jobs having every tag asked for (jobs_tags_idx covers tagged jobs only)
  AND (%(tags)s::text[] IS NULL OR j.tags @> %(tags)s::text[] AND j.tags IS NOT NULL)
  AND (%(stored_statuses)s::{schema}.job_status[] IS NULL
       OR j.status = ANY (%(stored_statuses)s::{schema}.job_status[])
          AND j.stage = ANY (%(stored_stages)s::{schema}.job_status[]))
  AND (%(due)s::boolean IS NULL OR (j.run_at <= now()) = %(due)s::boolean)
  AND (%(pattern)s::text IS NULL
       OR j.payload::text ILIKE %(pattern)s::text
       OR j.last_error ILIKE %(pattern)s::text)
  AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
  AND (%(min_id)s::bigint IS NULL OR j.id >= %(min_id)s::bigint)
ORDER BY j.id DESC
LIMIT %(limit)s;

-- name: job_list_finished
-- The jobs of job_list with one finished status, most recently finished
-- first, keyset-paginated on (finished_at, id): straight down the finished
-- index of that status's leaves however rare the status is.
SELECT j.id, j.queue, j.task, j.payload, j.priority, j.status::text AS status,
       j.run_at, j.attempts, j.max_attempts, j.dedup_key, j.serial_key, j.created_at,
       j.finished_at, j.last_error, j.result,
       coalesce(j.tags, '{}') AS tags, j.meta, j.progress, j.snoozes, j.group_key
FROM {schema}.jobs j
WHERE j.status = %(status)s::{schema}.job_status  -- a finished status
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
  AND (%(before_finished)s::timestamptz IS NULL
       OR j.finished_at <= %(before_finished)s::timestamptz)
  AND (%(before_finished)s::timestamptz IS NULL
       OR (j.finished_at, j.id) < (%(before_finished)s::timestamptz, %(before_id)s::bigint))
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: job_list_window
-- The window a search of job_list reads: the %(window)s newest ids below
-- %(before_id)s (primary key backwards), as its lowest and highest id and
-- how many it holds (fewer than %(window)s: no job is older).
SELECT min(w.id) AS floor, max(w.id) AS ceiling, count(*)::bigint AS examined
FROM (SELECT j.id FROM {schema}.jobs j
      WHERE (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
      ORDER BY j.id DESC
      LIMIT %(window)s) w;

-- name: job_status
-- The visible status of a job in the hot table or the archive.
SELECT {schema}.visible_status(status, run_at) FROM {schema}.jobs WHERE id = %(job_id)s
UNION ALL
SELECT status::text FROM {schema}.jobs_archive WHERE id = %(job_id)s
LIMIT 1;

-- name: queue_metrics
-- Per queue: controls, oldest ready age, and the queued, running, waiting,
-- event-waiting and sleeping counts,
-- each an index range of a partial index that leads with the queue name,
-- stopping at %(cap)s rows (the other statuses: queue_status_sample).
SELECT q.name AS queue, q.paused, q.concurrency_limit, q.rate_limit,
       extract(epoch FROM q.rate_period)::float8 AS rate_period_seconds,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_live j
            WHERE j.queue = q.name AND j.stage = 'queued' AND j.status = 'queued' LIMIT %(cap)s) c) AS queued,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_live j
            WHERE j.queue = q.name AND j.stage = 'queued' AND j.status = 'running' LIMIT %(cap)s) c) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_live j
            WHERE j.queue = q.name AND j.stage = 'waiting' LIMIT %(cap)s) c) AS waiting,
       -- Durable tasks: of the waiting jobs, those waiting for an event; and
       -- the scheduled jobs in a context.sleep (job_steps' partial indexes).
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_live j
            JOIN {schema}.job_steps s ON s.job_id = j.id AND s.status = 'waiting'
            WHERE j.queue = q.name AND j.stage = 'waiting' LIMIT %(cap)s) c) AS event_waiting,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.job_steps s
            JOIN {schema}.jobs_live j ON j.id = s.job_id
            WHERE s.status = 'sleeping' AND s.wake_at > now() AND j.queue = q.name
              AND j.stage = 'scheduled' LIMIT %(cap)s) c) AS sleeping,
       extract(epoch FROM now() - {schema}.queue_oldest_ready(q.name))::float8
           AS oldest_ready_age_seconds
FROM {schema}.queues q
WHERE %(queue)s::text IS NULL OR q.name = %(queue)s::text
ORDER BY q.name;

-- name: queue_status_sample
-- Up to cap_<status> jobs of each other status (scheduled split into due
-- and future, succeeded in the last hour), newest first through one partial
-- index each, counted by queue; "oldest" and "newest" bound the finishes (or
-- run_at) the sample reached, from which a capped count is extrapolated. The
-- caller passes a small cap where the planner expects far more rows than
-- the cap: those rows only give the per-queue shares of an estimate.
SELECT s.status, s.queue, count(*)::bigint AS n, min(s.at) AS oldest, max(s.at) AS newest
FROM (
    (SELECT CASE WHEN j.run_at <= now() THEN 'due' ELSE 'scheduled' END AS status, j.queue,
            j.run_at AS at
     FROM {schema}.jobs_live j WHERE j.stage = 'scheduled' ORDER BY j.run_at LIMIT %(cap_scheduled)s)
    UNION ALL
    (SELECT 'succeeded', j.queue, j.finished_at FROM {schema}.jobs j
     WHERE j.status = 'succeeded' AND j.finished_at > now() - interval '1 hour'
     ORDER BY j.finished_at DESC LIMIT %(cap_succeeded)s)
    UNION ALL
    (SELECT 'dead', j.queue, j.finished_at FROM {schema}.jobs j
     WHERE j.status = 'dead' ORDER BY j.finished_at DESC LIMIT %(cap_dead)s)
    UNION ALL
    (SELECT 'cancelled', j.queue, j.finished_at FROM {schema}.jobs j
     WHERE j.status = 'cancelled' ORDER BY j.finished_at DESC LIMIT %(cap_cancelled)s)
) s
GROUP BY s.status, s.queue;

-- name: job_wait_context
-- What a live job may be waiting on: an earlier live job with its serial key,
-- its queue's controls, and that queue's running count and recent leases.
SELECT
    (SELECT s.id FROM {schema}.jobs_live s
     WHERE s.serial_key = j.serial_key AND s.id <> j.id
       AND s.stage IN ('queued', 'scheduled')
       AND (s.id < j.id OR s.stage = 'queued' AND s.status = 'running')
     ORDER BY (s.stage = 'queued' AND s.status = 'running') DESC, s.id LIMIT 1) AS serial_blocker_id,
    (SELECT s.status::text FROM {schema}.jobs_live s
     WHERE s.serial_key = j.serial_key AND s.id <> j.id
       AND s.stage IN ('queued', 'scheduled')
       AND (s.id < j.id OR s.stage = 'queued' AND s.status = 'running')
     ORDER BY (s.stage = 'queued' AND s.status = 'running') DESC, s.id LIMIT 1) AS serial_blocker_status,
    q.paused, q.concurrency_limit, q.rate_limit,
    extract(epoch FROM q.rate_period)::float8 AS rate_period_seconds,
    (SELECT count(*) FROM {schema}.jobs_live r WHERE r.queue = j.queue AND r.stage = 'queued' AND r.status = 'running'
        AND r.lease_expires_at > now()) AS running_in_queue,
    (SELECT count(*) FROM {schema}.queue_lease_log l WHERE l.queue = j.queue
        AND l.leased_at > now() - q.rate_period) AS leases_in_window,
    (SELECT min(l.leased_at) + q.rate_period FROM {schema}.queue_lease_log l
        WHERE l.queue = j.queue AND l.leased_at > now() - q.rate_period) AS rate_next_slot,
    (SELECT count(*) FROM (
        SELECT 1 FROM {schema}.jobs_live a
        WHERE a.queue = j.queue AND a.stage = 'queued' AND a.status = 'queued'
          AND (a.priority, -extract(epoch FROM a.run_at), -a.id)
              > (j.priority, -extract(epoch FROM j.run_at), -j.id)
        LIMIT 10000) ahead) AS jobs_ahead,
    w.last_heartbeat_at AS worker_heartbeat_at,
    w.host AS worker_host
FROM {schema}.jobs j
LEFT JOIN {schema}.queues q ON q.name = j.queue
LEFT JOIN {schema}.workers w ON w.id = j.worker_id
WHERE j.id = %(job_id)s;

-- name: job_dead_count
-- How many dead jobs a bulk requeue with these filters would consider.
SELECT count(*) FROM {schema}.jobs j
WHERE j.status = 'dead'
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text);
