-- pgqueue revision 0014: replay is an admin action.
--
-- Until now replay was a read of the job plus a plain enqueue_batch, run by
-- the client: any producer (or worker) could copy any job of the schema.
-- replay_job does the same in the database, and, like cancel, requeue and
-- archive, only for the schema's owner and the roles `pgqueue grant --admin`
-- gives EXECUTE on every function: it is in neither the producer's nor the
-- worker's list (pgqueue/grants.py), and PUBLIC may not execute it.
--
-- It runs as its caller (SECURITY INVOKER): an admin may read both job
-- tables and call enqueue_batch anyway, so it needs no owner's rights.

-- Created as the schema's owner even when a member of it (an admin of
-- `pgqueue grant --admin`) migrates, as in 0005 and 0006.
DO $$
DECLARE
    v_owner name := (SELECT r.rolname FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     JOIN pg_roles r ON r.oid = n.nspowner
                     WHERE c.oid = '{schema}.jobs'::regclass);
BEGIN
    IF v_owner <> current_user AND pg_has_role(current_user, v_owner, 'MEMBER') THEN
        EXECUTE format('SET LOCAL ROLE %I', v_owner);
    END IF;
END;
$$;

-- A copy of job p_job_id (any status, in the hot table or the archive) as a
-- new job: same task, payload, priority, max_attempts, lease, backoff, dedup
-- and serial keys; queue p_queue (default: the original's) and run_at
-- p_run_at (default: now); attempts, result and history start afresh, and no
-- trace context is carried over. It goes through enqueue_batch, so it is
-- validated and announced (NOTIFY) like any enqueue, and a live job holding
-- the same (queue, dedup_key) is returned instead (created = false). No row
-- when there is no such job.
CREATE FUNCTION {schema}.replay_job(
    p_job_id bigint, p_queue text DEFAULT NULL, p_run_at timestamptz DEFAULT NULL
) RETURNS TABLE (job_id bigint, created boolean, replayed_from bigint)
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT b.job_id, b.created, p_job_id
FROM (
    SELECT task, payload, queue, priority, max_attempts, lease_seconds, dedup_key, serial_key,
           backoff_base, backoff_factor, backoff_max, backoff_jitter
    FROM {schema}.jobs WHERE id = p_job_id
    UNION ALL
    SELECT task, payload, queue, priority, max_attempts, lease_seconds, dedup_key, serial_key,
           backoff_base, backoff_factor, backoff_max, backoff_jitter
    FROM {schema}.jobs_archive WHERE id = p_job_id
    LIMIT 1
) src
CROSS JOIN LATERAL {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
    'task', src.task, 'payload', src.payload,
    'queue', coalesce(p_queue, src.queue), 'priority', src.priority,
    'run_at', coalesce(p_run_at, now()), 'max_attempts', src.max_attempts,
    'lease_seconds', src.lease_seconds, 'dedup_key', src.dedup_key,
    'serial_key', src.serial_key,
    'backoff', CASE WHEN src.backoff_base IS NOT NULL THEN jsonb_build_array(
        src.backoff_base, src.backoff_factor, src.backoff_max, src.backoff_jitter) END)))) b;
$$;

REVOKE EXECUTE ON FUNCTION {schema}.replay_job(bigint, text, timestamptz) FROM PUBLIC;
