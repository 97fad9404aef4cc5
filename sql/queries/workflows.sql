-- Workflows and jobs with dependencies (enqueue_graph in sql/schema.sql).

-- name: job_enqueue_graph
-- Enqueue a graph of steps in one statement (enqueue_batch given
-- {"graph": steps, "workflow": name}); one job id per step, in input order.
SELECT job_id FROM {schema}.enqueue_batch(%(graph)s::jsonb);

-- name: workflow_get
-- Workflows' rows, by id.
SELECT w.id, w.name, w.created_at FROM {schema}.workflows w
WHERE w.id = ANY (%(workflow_ids)s::bigint[]);

-- name: workflow_steps
-- Workflows' steps as jobs (live or archived), in enqueue order.
SELECT s.workflow_id, s.step, j.id, j.queue, j.task, j.payload, j.priority,
       {schema}.visible_status(j.status, j.run_at) AS status,
       j.run_at, j.attempts, j.max_attempts, j.dedup_key, j.serial_key, j.created_at,
       j.finished_at, j.last_error, j.result,
       coalesce(j.tags, '{}') AS tags, j.meta, j.progress, j.snoozes
FROM {schema}.job_waits s
JOIN {schema}.jobs j ON j.id = s.job_id
WHERE s.workflow_id = ANY (%(workflow_ids)s::bigint[])
UNION ALL
SELECT s.workflow_id, s.step, a.id, a.queue, a.task, a.payload, a.priority, a.status::text, a.run_at,
       a.attempts, a.max_attempts, a.dedup_key, a.serial_key, a.created_at, a.finished_at,
       a.last_error, a.result, coalesce(a.tags, '{}'), a.meta, a.progress, a.snoozes
FROM {schema}.job_waits s
JOIN {schema}.jobs_archive a ON a.id = s.job_id
WHERE s.workflow_id = ANY (%(workflow_ids)s::bigint[])
ORDER BY id;

-- name: workflow_edges
-- Which step waits for which, by job id.
SELECT d.job_id, d.depends_on
FROM {schema}.job_waits s
JOIN {schema}.job_dependencies d ON d.job_id = s.job_id
WHERE s.workflow_id = ANY (%(workflow_ids)s::bigint[])
ORDER BY d.job_id, d.depends_on;

-- name: workflow_list
-- Ids of workflows, newest first; status running until every step ended,
-- then succeeded (all succeeded) or failed. %(status)s filters on it, and
-- %(name)s on the name (no index on it: a scan of workflows, newest first,
-- that stops at %(scan)s of that name).
SELECT l.id FROM (
    SELECT w.id,
           CASE WHEN bool_and(coalesce(j.stage, a.status) IN ('succeeded', 'dead', 'cancelled'))
                THEN CASE WHEN bool_and(coalesce(j.stage, a.status) = 'succeeded')
                          THEN 'succeeded' ELSE 'failed' END
                ELSE 'running' END AS status
    FROM {schema}.workflows w
    JOIN {schema}.job_waits s ON s.workflow_id = w.id
    LEFT JOIN {schema}.jobs j ON j.id = s.job_id
    LEFT JOIN {schema}.jobs_archive a ON a.id = s.job_id
    WHERE w.id IN (SELECT x.id FROM {schema}.workflows x
                   WHERE %(name)s::text IS NULL OR x.name = %(name)s::text
                   ORDER BY x.id DESC LIMIT %(scan)s)
    GROUP BY w.id
) l
WHERE %(status)s::text IS NULL OR l.status = %(status)s::text
ORDER BY l.id DESC
LIMIT %(limit)s;

-- name: job_dependencies
-- A job's workflow and its direct dependencies: step name (the job id as
-- text for a plain depends_on), status and stored result.
SELECT w.workflow_id, coalesce(ds.step, d.depends_on::text) AS name,
       coalesce(j.status, a.status)::text AS status, coalesce(j.result, a.result) AS result
FROM (SELECT %(job_id)s::bigint AS job_id) me
LEFT JOIN {schema}.job_waits w ON w.job_id = me.job_id
LEFT JOIN {schema}.job_dependencies d ON d.job_id = me.job_id
LEFT JOIN {schema}.job_waits ds ON ds.job_id = d.depends_on
LEFT JOIN {schema}.jobs j ON j.id = d.depends_on
LEFT JOIN {schema}.jobs_archive a ON a.id = d.depends_on
ORDER BY d.depends_on;
