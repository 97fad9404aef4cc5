-- The web dashboard's own reads (pgqueue/ops/dashboard.py); its job lists
-- are the job_list statements of inspect.sql.
-- Every statement here is bounded: counts stop at a cap, lists read a
-- keyset page through an index, aggregates sample the newest rows of one
-- partial index. Nothing scans the whole jobs table however big it grows.

-- name: dashboard_throughput
-- Jobs finished per minute over the last hour, from finished_at: for each
-- minute and outcome an index range of jobs_finished_idx that stops at
-- %(per_minute)s rows (a minute that reached it is estimated from the rate of
-- those rows), and for the whole hour and each outcome one range that stops
-- at %(hour_cap)s rows: below it the hour's totals are exact, however the
-- jobs fell into minutes. The cost stays bounded however busy the system is.
-- (ORDER BY finished_at keeps those ranges on the index: with a bare LIMIT
-- the planner may prefer a sequential scan when most rows are recent.)
WITH minutes AS (
    SELECT m.start, least(m.start + interval '1 minute', now()) AS stop
    FROM generate_series(date_trunc('minute', now()) - interval '59 minutes',
                         date_trunc('minute', now()), interval '1 minute') AS m(start)
), hour AS (
    SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs j
                                  WHERE j.status = 'succeeded' AND j.finished_at >= h.start
                                  ORDER BY j.finished_at LIMIT %(hour_cap)s) x)::bigint AS succeeded,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs j
                                  WHERE j.status = 'dead' AND j.finished_at >= h.start
                                  ORDER BY j.finished_at LIMIT %(hour_cap)s) x)::bigint AS dead
    FROM (SELECT date_trunc('minute', now()) - interval '59 minutes' AS start) h
)
SELECT extract(epoch FROM m.start)::bigint AS minute,
       ok.n AS succeeded_seen, extract(epoch FROM ok.last_at - m.start)::float8 AS succeeded_span,
       dead.n AS dead_seen, extract(epoch FROM dead.last_at - m.start)::float8 AS dead_span,
       extract(epoch FROM m.stop - m.start)::float8 AS seconds,
       hour.succeeded AS hour_succeeded, hour.dead AS hour_dead
FROM minutes m
CROSS JOIN hour
CROSS JOIN LATERAL (
    SELECT count(*)::bigint AS n, max(x.finished_at) AS last_at
    FROM (SELECT j.finished_at FROM {schema}.jobs j
          WHERE j.status = 'succeeded' AND j.finished_at >= m.start AND j.finished_at < m.stop
          ORDER BY j.finished_at LIMIT %(per_minute)s) x
) ok
CROSS JOIN LATERAL (
    SELECT count(*)::bigint AS n, max(x.finished_at) AS last_at
    FROM (SELECT j.finished_at FROM {schema}.jobs j
          WHERE j.status = 'dead' AND j.finished_at >= m.start AND j.finished_at < m.stop
          ORDER BY j.finished_at LIMIT %(per_minute)s) x
) dead
ORDER BY m.start;

-- name: dashboard_dead_groups
-- The newest %(cap)s dead jobs (finished index, newest first) grouped by task,
-- error code and a fingerprint of the message with numbers, hex ids and
-- quoted values masked, so "user 17 not found" and "user 42 not found" fall
-- in one group.
WITH recent AS (
    SELECT j.id, j.task, j.queue, j.finished_at,
           split_part(coalesce(j.last_error, ''), ': ', 1) AS error_code,
           substr(coalesce(j.last_error, ''), length(split_part(coalesce(j.last_error, ''), ': ', 1)) + 3)
               AS message
    FROM {schema}.jobs j
    WHERE j.status = 'dead'
    ORDER BY j.finished_at DESC
    LIMIT %(cap)s
), marked AS (
    SELECT r.*, left(md5(regexp_replace(regexp_replace(regexp_replace(left(r.message, 500),
               '''[^'']*''|"[^"]*"', '?', 'g'),
               '0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}(-[0-9a-fA-F]{4,})*', 'H', 'g'),
               '[0-9]+', 'N', 'g')), 12) AS fingerprint
    FROM recent r
)
SELECT m.task, m.error_code, m.fingerprint, count(*)::bigint AS count,
       min(m.finished_at) AS first_seen, max(m.finished_at) AS last_seen,
       max(m.id) AS sample_job_id,
       (array_agg(m.message ORDER BY m.id DESC))[1] AS sample_message,
       array_agg(DISTINCT m.queue ORDER BY m.queue) AS queues
FROM marked m
GROUP BY m.task, m.error_code, m.fingerprint
ORDER BY count(*) DESC, max(m.finished_at) DESC
LIMIT 500;

-- name: dashboard_dead_group_ids
-- The next %(limit)s dead jobs of a task, newest first after the keyset
-- (finished_at, id) cursor, with the error code and fingerprint of
-- dashboard_dead_groups; the caller keeps the rows of its group.
SELECT j.id, j.finished_at,
       split_part(coalesce(j.last_error, ''), ': ', 1) AS error_code,
       left(md5(regexp_replace(regexp_replace(regexp_replace(left(
           substr(coalesce(j.last_error, ''),
                  length(split_part(coalesce(j.last_error, ''), ': ', 1)) + 3), 500),
           '''[^'']*''|"[^"]*"', '?', 'g'),
           '0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}(-[0-9a-fA-F]{4,})*', 'H', 'g'),
           '[0-9]+', 'N', 'g')), 12) AS fingerprint
FROM {schema}.jobs j
WHERE j.status = 'dead' AND j.task = %(task)s::text
  AND (%(after_finished)s::timestamptz IS NULL
       OR j.finished_at <= %(after_finished)s::timestamptz)
  AND (%(after_finished)s::timestamptz IS NULL
       OR (j.finished_at, j.id) < (%(after_finished)s::timestamptz, %(after_id)s::bigint))
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: dashboard_change_mark
-- A cheap fingerprint of what changed: the newest job id and the newest
-- finish of each outcome (one index probe each), for the live updates.
SELECT (SELECT max(id) FROM {schema}.jobs) AS newest_id,
       (SELECT max(finished_at) FROM {schema}.jobs WHERE status = 'succeeded') AS succeeded,
       (SELECT max(finished_at) FROM {schema}.jobs WHERE status = 'dead') AS dead,
       (SELECT max(finished_at) FROM {schema}.jobs WHERE status = 'cancelled') AS cancelled,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs_live WHERE stage = 'queued' AND status = 'running'
                              LIMIT 10001) r) AS running,
       (SELECT max(updated_at) FROM {schema}.queues) AS queues,
       (SELECT max(last_heartbeat_at) FROM {schema}.workers) AS workers;
