-- Reverts 0017_lean_enqueue: the CHECK constraints of jobs in their 0005 forms, enqueue_job
-- as in 0012.

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

ALTER TABLE {schema}.jobs
    DROP CONSTRAINT jobs_run_at_range,
    DROP CONSTRAINT jobs_backoff_range,
    ADD CONSTRAINT jobs_run_at_range
        CHECK (run_at >= '1970-01-01 00:00:00+00' AND run_at < '2500-01-01 00:00:00+00') NOT VALID,
    ADD CONSTRAINT jobs_backoff_range CHECK (
        coalesce(backoff_base BETWEEN 0 AND 31536000, true)
        AND coalesce(backoff_factor BETWEEN 0 AND 1000, true)
        AND coalesce(backoff_max BETWEEN 0 AND 31536000, true)
        AND coalesce(backoff_jitter BETWEEN 0 AND 1, true)) NOT VALID;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_run_at_range;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_backoff_range;

-- As in 0012.
CREATE OR REPLACE FUNCTION {schema}.enqueue_job(
    p_task             text,
    p_payload          jsonb DEFAULT '{}',
    p_queue            text DEFAULT NULL,
    p_priority         integer DEFAULT NULL,
    p_run_at           timestamptz DEFAULT NULL,
    p_delay            float8 DEFAULT NULL,
    p_max_attempts     integer DEFAULT NULL,
    p_lease_seconds    integer DEFAULT NULL,
    p_dedup_key        text DEFAULT NULL,
    p_serial_key       text DEFAULT NULL,
    p_backoff          real[] DEFAULT NULL,
    p_lookup           boolean DEFAULT false,
    p_default_priority integer DEFAULT NULL
) RETURNS TABLE (job_id bigint, created boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto
AS $$
DECLARE
    v_max_bytes integer;
    v_quotas    boolean;
    v_registry  {schema}.tasks;
    v_setting   smallint;
    v_queue     text;
    v_priority  integer;
    v_run_at    timestamptz;
    v_status    {schema}.job_status;
    v_backoff   real[];
    v_id        bigint;
BEGIN
    -- One statement reads the limits and, when some operator priority
    -- setting exists, the task's.
    SELECT l.max_payload_bytes, l.max_queues IS NOT NULL OR l.max_queued_per_queue IS NOT NULL,
           CASE WHEN p_priority IS NULL AND EXISTS (
                    SELECT 1 FROM {schema}.task_settings s WHERE s.priority IS NOT NULL)
                THEN (SELECT s.priority FROM {schema}.task_settings s WHERE s.name = p_task) END
    INTO v_max_bytes, v_quotas, v_setting
    FROM {schema}.limits l;
    IF p_lookup THEN
        SELECT g.* INTO v_registry FROM {schema}.tasks g WHERE g.name = p_task;
    END IF;
    v_queue := coalesce(p_queue, v_registry.queue, 'default');
    v_priority := coalesce(p_priority, v_setting, p_default_priority, v_registry.priority, 0);
    v_backoff := coalesce(p_backoff, v_registry.backoff);
    -- delay is added to the database clock, never the client's.
    v_run_at := coalesce(p_run_at, now() + make_interval(secs => CASE
                    WHEN p_delay BETWEEN 0 AND 3153600000 THEN coalesce(p_delay, 0) ELSE 0 END));
    -- The common case is decided by plain expressions, as in enqueue_input;
    -- anything else goes to check_job, which names the problem.
    IF NOT coalesce(
            length(p_task) BETWEEN 1 AND 255 AND p_task !~ '[[:cntrl:]]' AND btrim(p_task) <> ''
            AND length(v_queue) BETWEEN 1 AND 128 AND v_queue !~ '[^A-Za-z0-9_.:-]'
            AND jsonb_typeof(p_payload) = 'object'
            AND pg_column_size(p_payload) * 8 <= least(8000, v_max_bytes)
            AND (p_dedup_key IS NULL OR octet_length(p_dedup_key) BETWEEN 1 AND 1024)
            AND (p_serial_key IS NULL OR octet_length(p_serial_key) BETWEEN 1 AND 1024)
            AND (p_priority IS NULL OR p_priority BETWEEN -32768 AND 32767)
            AND (p_default_priority IS NULL OR p_default_priority BETWEEN -32768 AND 32767)
            AND (p_delay IS NULL OR p_delay BETWEEN 0 AND 3153600000)
            AND v_run_at >= '1970-01-01 00:00:00+00' AND v_run_at < '2500-01-01 00:00:00+00'
            AND (p_max_attempts IS NULL OR p_max_attempts >= 0)
            AND (p_lease_seconds IS NULL OR p_lease_seconds >= 1)
            AND p_backoff IS NULL, false) THEN
        PERFORM {schema}.check_job(
            NULL, p_task, coalesce(p_payload, 'null'::jsonb), v_queue,
            coalesce(p_priority, p_default_priority),
            CASE WHEN p_delay IS NULL OR p_delay BETWEEN 0 AND 3153600000 THEN v_run_at
                 ELSE now() END,
            p_delay, p_max_attempts, p_lease_seconds, p_dedup_key, p_serial_key, p_backoff,
            coalesce(v_max_bytes, 1048576));
    END IF;
    v_status := CASE WHEN v_run_at > now() THEN 'scheduled' ELSE 'queued' END;

    FOR attempt IN 1..10 LOOP
        INSERT INTO {schema}.jobs AS j (
            task, payload, queue, priority, run_at, status, max_attempts, lease_seconds,
            dedup_key, serial_key, backoff_base, backoff_factor, backoff_max, backoff_jitter)
        VALUES (p_task, p_payload, v_queue, v_priority, v_run_at, v_status,
                coalesce(p_max_attempts, v_registry.max_attempts, 5),
                coalesce(p_lease_seconds, v_registry.lease_seconds, 60),
                p_dedup_key, p_serial_key, v_backoff[1], v_backoff[2], v_backoff[3], v_backoff[4])
        ON CONFLICT (queue, dedup_key)
            WHERE dedup_key IS NOT NULL AND status IN ('queued', 'scheduled', 'running')
        DO NOTHING
        RETURNING j.id INTO v_id;
        IF v_id IS NOT NULL THEN
            created := true;
            EXIT;
        END IF;
        -- A new statement, so a new snapshot: it sees the live duplicate
        -- that made the insert skip.
        SELECT j.id INTO v_id FROM {schema}.jobs j
        WHERE j.queue = v_queue AND j.dedup_key = p_dedup_key
          AND j.status IN ('queued', 'scheduled', 'running')
        LIMIT 1;
        IF v_id IS NOT NULL THEN
            created := false;
            EXIT;
        END IF;
        -- The live duplicate finished in between: try again.
    END LOOP;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'pgqueue: dedup keys kept changing under this enqueue; retry it'
            USING ERRCODE = '40001';
    END IF;
    IF created THEN
        -- Registered once; afterwards a look-up, cheaper than ON CONFLICT.
        IF NOT EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.name = v_queue) THEN
            INSERT INTO {schema}.queues (name) VALUES (v_queue) ON CONFLICT (name) DO NOTHING;
        END IF;
        PERFORM {schema}.notify_enqueued(v_queue, 1, CASE WHEN v_status = 'queued' THEN 1 ELSE 0 END, v_id);
    END IF;
    IF v_quotas THEN
        PERFORM {schema}.check_quotas(jsonb_build_array(jsonb_build_object('queue', v_queue)));
    END IF;
    job_id := v_id;
    RETURN NEXT;
END;
$$;
