-- Hot-path statements: enqueue, lease, complete, extend.
-- Every completion matches on (id, attempt_id, status = 'running'): a holder
-- whose lease was reaped and re-leased presents an old attempt id and matches
-- nothing, so a late result can never overwrite a newer attempt.

-- name: job_enqueue_one
-- Enqueue one job (fields as in a job object of job_enqueue_batch; NULL:
-- the default). One row (job_id, created).
SELECT job_id, created FROM {schema}.enqueue_job(
    %(task)s::text, %(payload)s::jsonb, %(queue)s::text, %(priority)s::integer,
    %(run_at)s::timestamptz, %(delay)s::float8, %(max_attempts)s::integer,
    %(lease_seconds)s::integer, %(dedup_key)s::text, %(serial_key)s::text,
    %(backoff)s::real[], %(lookup)s::boolean, %(default_priority)s::integer,
    %(group_key)s::text);

-- name: job_enqueue_payloads
-- Enqueue one job per payload of a JSON array, all with the fields of one job
-- object (no payload or dedup key in it); the new ids in input order, as an array.
SELECT {schema}.enqueue_payloads(%(job)s::jsonb, %(payloads)s::jsonb);

-- name: job_enqueue_batch
-- Enqueue a JSON array of job objects; one row (job_id, created) per input, in order.
SELECT job_id, created FROM {schema}.enqueue_batch(%(jobs)s::jsonb);

-- name: job_enqueue_windowed
-- Enqueue a JSON array of job objects some of which carry dedup_window or
-- debounce (seconds); one row (job_id, created) per input, in order.
SELECT job_id, created FROM {schema}.enqueue_windowed(%(jobs)s::jsonb);

-- name: job_lease
-- Lease up to %(limit)s jobs of the given queues (NULL: all) for a worker,
-- starting after its lease cursors %(after)s (NULL: from the heads; see
-- lease_jobs). Each job's lease order key comes back too (priority, run_at,
-- job_id) and whether the cursor may move past it (ordered); run_at in
-- microseconds since the epoch, as the announcements carry it (an integer:
-- no timestamp to decode per leased row).
SELECT job_id, attempt_id, attempt, task, queue, payload, lease_expires_at, lease_seconds,
       tags, meta, group_key, priority, (extract(epoch FROM run_at) * 1000000)::bigint AS run_at_us,
       ordered
FROM {schema}.lease_jobs(%(queues)s::text[], %(worker_id)s, %(limit)s,
                         %(lease_seconds)s::integer, %(now)s::timestamptz, %(after)s::jsonb);

-- name: job_ready_queues
-- The queues holding ready jobs (a loose scan of the ready index: one probe
-- per such queue), for a worker serving every queue.
WITH RECURSIVE ready(name) AS (
    (SELECT j.queue FROM {schema}.jobs_live j
     WHERE j.stage = 'queued' AND j.status = 'queued' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs_live j
            WHERE j.queue > r.name AND j.stage = 'queued' AND j.status = 'queued'
            ORDER BY j.queue LIMIT 1)
    FROM ready r WHERE r.name IS NOT NULL
)
SELECT r.name FROM ready r WHERE r.name IS NOT NULL;

-- name: job_ack_many
-- Finish leased jobs successfully (cancelled if a cancel was requested while
-- they ran). Returns the (id, attempt_id) pairs that still held their lease.
-- A result that could not be stored leaves result NULL and says why in last_error.
SELECT job_id, attempt_id
FROM {schema}.ack_jobs(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(results)s::jsonb[],
                       %(now)s::timestamptz, %(result_errors)s::text[]);

-- name: job_fail_many
-- Record failed attempts: requeue with the given retry time or the job's
-- backoff, or dead-letter (permanent, or attempts exhausted), or cancel (a
-- cancel was requested), or hand back unknown tasks within their grace
-- (%(graces)s, see fail_jobs in sql/schema.sql). Returns (id, attempt_id, status) of
-- the attempts that held their lease.
SELECT job_id, attempt_id, status
FROM {schema}.fail_jobs(
    %(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(outcomes)s::text[],
    %(retry_ats)s::timestamptz[], %(retry_delays)s::float8[], %(permanent)s::boolean[],
    %(error_codes)s::text[], %(error_messages)s::text[], %(tracebacks)s::text[],
    %(now)s::timestamptz, %(graces)s::float8[]);

-- name: job_nack_many
-- Hand leased jobs back unrun: queued again at their old place, the attempt
-- recorded as 'released' and not counted. Returns the ids that held their lease.
SELECT job_id, attempt_id
FROM {schema}.release_jobs(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(now)s::timestamptz);

-- name: job_extend_many
-- Heartbeat: push the leases of running jobs to now + seconds. Returns, for
-- every job that still holds its lease, whether a cancel was requested;
-- jobs missing from the result have lost their lease.
SELECT job_id, cancel_requested
FROM {schema}.extend_jobs(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[], %(seconds)s::float8[],
                          %(now)s::timestamptz);

-- name: job_cancel_flags
-- Which of these running attempts have been asked to stop, and which lost their lease.
SELECT c.job_id, j.cancel_requested,
       (j.id IS NOT NULL AND j.status = 'running' AND j.attempt_id = c.attempt_id) AS held
FROM unnest(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[]) AS c(job_id, attempt_id)
LEFT JOIN {schema}.jobs_live j ON j.id = c.job_id;

-- name: job_next_due
-- Seconds until the earliest scheduled job becomes due or a full rate-limit
-- window of one of these queues (NULL: all) frees a slot; NULL when neither.
-- On the server's clock so that client clock skew does not matter.
SELECT extract(epoch FROM least(
    (SELECT min(run_at) FROM {schema}.jobs_live WHERE stage = 'scheduled'),
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
SELECT s FROM {schema}.watch_job(%(job_id)s::bigint) s WHERE s IS NOT NULL;

-- name: job_result
-- A job's status, stored result and last error, from the hot table or the archive.
SELECT status::text, result, last_error FROM {schema}.jobs WHERE id = %(job_id)s
UNION ALL
SELECT status::text, result, last_error FROM {schema}.jobs_archive WHERE id = %(job_id)s
LIMIT 1;

-- name: job_set_progress
-- Store running jobs' progress (context.set_progress), fenced by the attempt
-- id (through extend_jobs: NULL seconds leave the lease alone).
SELECT job_id FROM {schema}.extend_jobs(%(job_ids)s::bigint[], %(attempt_ids)s::bigint[],
    array_fill(NULL::float8, ARRAY[cardinality(%(job_ids)s::bigint[])]), NULL, %(progress)s::jsonb[]);
