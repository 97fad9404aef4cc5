-- Cron schedules. Fire times are computed in Python (pgqueue.cron) from the
-- database clock read here; exactly-once per fire time rests on the
-- compare-and-set in schedule_fire_many (see sql/migrations/0002_schedules.up.sql).

-- name: schedule_now
-- The database clock (or the App's frozen test clock).
SELECT coalesce(%(now)s::timestamptz, now());

-- name: schedule_get
SELECT name, cron, timezone, task, queue, payload, priority, max_attempts, enabled,
       next_fire_at, last_fire_at, last_job_id, revision, created_at, updated_at
FROM {schema}.schedules
WHERE name = %(name)s;

-- name: schedule_list
SELECT name, cron, timezone, task, queue, payload, priority, max_attempts, enabled,
       next_fire_at, last_fire_at, last_job_id, revision, created_at, updated_at
FROM {schema}.schedules
ORDER BY name;

-- name: schedule_upsert
-- Create a schedule, or (with %(replace)s) change it. An unchanged cron and
-- time zone keep the stored next_fire_at, so re-registering a periodic task
-- at every worker start never skips the slot a down scheduler missed. With
-- %(keep_enabled)s (periodic registration) an existing schedule keeps its
-- enabled state: an operator's `schedule disable` survives a deploy.
-- Returns nothing when the name exists and replace is false, or when nothing
-- would change (no write, no revision bump, no notification).
INSERT INTO {schema}.schedules AS s
    (name, cron, timezone, task, queue, payload, priority, max_attempts, enabled, next_fire_at)
VALUES (%(name)s, %(cron)s, %(timezone)s, %(task)s, %(queue)s, %(payload)s::jsonb,
        %(priority)s, %(max_attempts)s, %(enabled)s, %(next_fire_at)s)
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone,
    task = EXCLUDED.task,
    queue = EXCLUDED.queue,
    payload = EXCLUDED.payload,
    priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts,
    enabled = s.enabled AND %(keep_enabled)s OR EXCLUDED.enabled AND NOT %(keep_enabled)s,
    next_fire_at = CASE
        WHEN NOT (s.enabled AND %(keep_enabled)s OR EXCLUDED.enabled AND NOT %(keep_enabled)s)
            THEN NULL
        WHEN s.enabled AND s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
            THEN s.next_fire_at
        ELSE EXCLUDED.next_fire_at END,
    revision = s.revision + 1,
    updated_at = now()
WHERE %(replace)s
  AND (s.cron, s.timezone, s.task, s.queue, s.payload, s.priority, s.max_attempts, s.enabled)
      IS DISTINCT FROM
      (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.task, EXCLUDED.queue, EXCLUDED.payload,
       EXCLUDED.priority, EXCLUDED.max_attempts,
       s.enabled AND %(keep_enabled)s OR EXCLUDED.enabled AND NOT %(keep_enabled)s)
RETURNING s.name, s.cron, s.timezone, s.task, s.queue, s.payload, s.priority,
          s.max_attempts, s.enabled, s.next_fire_at, s.last_fire_at, s.last_job_id,
          s.revision, s.created_at, s.updated_at;

-- name: schedule_enable
-- Enable from the next fire time after now: slots that passed while it was
-- disabled never fire. Matches nothing when the cron or time zone changed
-- after the caller computed %(next_fire_at)s from them (the caller retries).
UPDATE {schema}.schedules s
SET enabled = true,
    next_fire_at = CASE WHEN s.enabled THEN s.next_fire_at ELSE %(next_fire_at)s END,
    revision = s.revision + CASE WHEN s.enabled THEN 0 ELSE 1 END,
    updated_at = CASE WHEN s.enabled THEN s.updated_at ELSE now() END
WHERE s.name = %(name)s AND s.cron = %(cron)s AND s.timezone = %(timezone)s
RETURNING s.name, s.cron, s.timezone, s.task, s.queue, s.payload, s.priority,
          s.max_attempts, s.enabled, s.next_fire_at, s.last_fire_at, s.last_job_id,
          s.revision, s.created_at, s.updated_at;

-- name: schedule_disable
UPDATE {schema}.schedules s
SET enabled = false, next_fire_at = NULL, revision = s.revision + 1, updated_at = now()
WHERE s.name = %(name)s
RETURNING s.name, s.cron, s.timezone, s.task, s.queue, s.payload, s.priority,
          s.max_attempts, s.enabled, s.next_fire_at, s.last_fire_at, s.last_job_id,
          s.revision, s.created_at, s.updated_at;

-- name: schedule_remove
DELETE FROM {schema}.schedules WHERE name = %(name)s RETURNING name;

-- name: schedule_run_now
-- Enqueue one job of a schedule now (its fire times are untouched) and note it
-- as the schedule's last job. Nothing when the schedule was removed or changed
-- after the caller built the job from it. The jobs are passed through the
-- locked row so that enqueue_batch runs only when that row exists.
WITH target AS MATERIALIZED (
    SELECT s.name, %(jobs)s::jsonb AS jobs
    FROM {schema}.schedules s
    WHERE s.name = %(name)s AND s.revision = %(revision)s
    FOR UPDATE
), enqueued AS (
    SELECT t.name, e.job_id, e.created
    FROM target t CROSS JOIN LATERAL {schema}.enqueue_batch(t.jobs) e
), noted AS (
    UPDATE {schema}.schedules s SET last_job_id = e.job_id
    FROM enqueued e WHERE s.name = e.name
)
SELECT job_id, created FROM enqueued;

-- name: schedule_due
-- Enabled schedules due at the database clock (oldest first, at most
-- %(limit)s), with that clock and the earliest fire time still ahead.
-- Always returns a row: its schedule columns are NULL when nothing is due.
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT clock.now,
       (SELECT min(n.next_fire_at) FROM {schema}.schedules n
        WHERE n.enabled AND n.next_fire_at > clock.now) AS next_due,
       d.name, d.cron, d.timezone, d.task, d.queue, d.payload, d.priority,
       d.max_attempts, d.next_fire_at, d.revision, d.created_at
FROM clock
LEFT JOIN LATERAL (
    SELECT s.* FROM {schema}.schedules s
    WHERE s.enabled AND s.next_fire_at <= clock.now
    ORDER BY s.next_fire_at
    LIMIT %(limit)s
) d ON true;

-- name: schedule_fire_many
-- Fire due schedules, one array element per schedule: the jobs of its fire
-- times (a JSON array for enqueue_batch) and its new next_fire_at. A schedule
-- is fired only while it still has the next_fire_at (%(due_at)s), revision
-- and created_at (a schedule removed and added again starts over at revision
-- 1) the caller read: the compare-and-set that makes each fire time
-- enqueue exactly once, however many schedulers run. FOR UPDATE re-checks
-- those conditions on the newest committed row version; SKIP LOCKED leaves a
-- row another scheduler is firing right now to that scheduler. Returns the
-- schedules fired with their new job ids; the others were fired (or changed)
-- by someone else and enqueued nothing here.
SELECT name, job_ids
FROM {schema}.fire_schedules(%(names)s::text[], %(due_at)s::timestamptz[],
                             %(revisions)s::bigint[], %(created_at)s::timestamptz[],
                             %(next_fire_at)s::timestamptz[], %(last_fire_at)s::timestamptz[],
                             %(jobs)s::jsonb[]);

-- name: schedule_register_periodic
-- Create or update the schedule of an @app.periodic task (never one an
-- operator added, unless the caller owns the schema). No row: nothing changed.
SELECT name, cron, timezone, task, queue, payload, priority, max_attempts, enabled,
       next_fire_at, last_fire_at, last_job_id, revision, created_at, updated_at
FROM {schema}.register_periodic(%(name)s, %(cron)s, %(timezone)s, %(task)s, %(queue)s,
                                %(payload)s::jsonb, %(priority)s::smallint,
                                %(max_attempts)s::integer, %(enabled)s::boolean,
                                %(next_fire_at)s::timestamptz);
