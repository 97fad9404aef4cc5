-- Durable tasks: context.step, context.sleep, context.wait_for_event and
-- send_event. None of these runs for a job that uses none of them.

-- name: step_list
-- A job's stored steps, sleeps and event waits, oldest first: (name, kind,
-- status, result, started_at, finished_at, wake_at, event_key). A sleep
-- whose wake-up time passed shows as 'slept'.
SELECT s.name, s.kind,
       CASE WHEN s.status = 'sleeping' AND s.wake_at <= now() THEN 'slept' ELSE s.status END AS status,
       s.result, s.started_at, s.finished_at, s.wake_at, s.event_key
FROM {schema}.job_steps s
WHERE s.job_id = %(job_id)s::bigint
ORDER BY s.started_at, s.name;

-- name: step_store
-- Store a step's JSON result (or a sleep) for a running job, fenced by its
-- attempt id (store_step). One row: true, or false when the lease was lost.
SELECT {schema}.store_step(%(job_id)s::bigint, %(attempt_id)s::bigint, %(name)s::text,
                           %(kind)s::text, %(status)s::text, %(result)s::jsonb,
                           %(started_at)s::timestamptz, %(wake_at)s::timestamptz);

-- name: step_wait_event
-- context.wait_for_event: (outcome, payload), outcome one of received,
-- timed_out, waiting (the job now waits), cancelled, lost (wait_event).
SELECT outcome, payload
FROM {schema}.wait_event(%(job_id)s::bigint, %(attempt_id)s::bigint, %(name)s::text,
                         %(key)s::text, %(timeout)s::float8, %(started_at)s::timestamptz);

-- name: event_send
-- Store an event and release the jobs waiting for it (send_event), in the
-- caller's transaction. One row: how many jobs it released.
SELECT {schema}.send_event(%(key)s::text, %(payload)s::jsonb);
