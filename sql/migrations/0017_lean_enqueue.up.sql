-- pgqueue revision 0017: less server work per enqueue (issue #19, hot path).
--
-- Measured per App.enqueue call (enqueue_job of one job, no options) with
-- callgrind on a single-user backend, instructions per call: 894k at 0015,
-- 774k here (-13 %); 98k of it from the CHECK constraints. Backend CPU time
-- (benchmarks.enqueue_cpu, medians, 0015 and 0017 in the same run; the
-- machine was shared): 302 -> 284 and 285 -> 277 us per call in two runs
-- (the floor: 124-132 us); WAL 376 -> 328 bytes per job.
--
-- * The CHECK constraints of jobs, same names, same rows refused, cheaper
--   forms. PostgreSQL reads a table's CHECK expressions from their stored
--   text (stringToNode) and plans them anew for every INSERT or UPDATE
--   statement, so a one-row insert pays for their size: 7 kB of node text,
--   255k instructions, 28 % of enqueue_job. jobs_backoff_range alone (four
--   coalesce(x BETWEEN ...) with casts to float8) was 200k of it:
--     jobs_run_at_range   run_at >= 1970 AND run_at < 2500
--                         -> run_at <@ '[1970, 2500)'::tstzrange
--     jobs_backoff_range  coalesce(x BETWEEN 0 AND max_x, true) for each x
--                         -> least(all four) >= 0 AND
--                            greatest(base, max, factor * 31536,
--                                     jitter * 31536000) <= 31536000
--   Together 255k -> 157k instructions per single-row insert. Why the
--   backoff form refuses exactly what the old one refused: LEAST and
--   GREATEST skip NULLs (all NULL: NULL, which a CHECK passes, as before);
--   a NaN is the greatest float, so GREATEST refuses it as BETWEEN did; the
--   products are float8 products of a real (24-bit mantissa) and a constant
--   below 2^25, exact in float8's 53 bits (and never overflowing), so
--   factor * 31536 <= 31536000 exactly when factor <= 1000, and jitter *
--   31536000 <= 31536000 exactly when jitter <= 1. (A numrange form would be
--   smaller still but is wrong: real -> numeric rounds to 6 digits, so
--   31536002 would pass.) Swapped as in 0005: NOT VALID, then VALIDATE, which
--   does not block writers.
-- * enqueue_job without a dedup key inserts with a plain INSERT: ON CONFLICT
--   is a speculative insertion (a speculative lock, a pre-check of the
--   arbiter index and a HEAP_CONFIRM WAL record, 48 of 377 WAL bytes per job)
--   even when dedup_key is NULL and nothing can conflict. 10k instructions.
-- * enqueue_job reads whether the queue is registered in the statement that
--   reads the limits (one statement less), and notifies through an
--   assignment (a plpgsql simple expression, no SPI statement). 5k.
-- Left alone, measured: the two regular expressions of the fast validation
-- (7k together, and the same check must stay in the database); merging the
-- registry look-up into the limits statement (50k more: a join's executor
-- start-up costs more than a second statement); SET plan_cache_mode = auto
-- (the App's sessions run force_custom_plan: without it every statement in
-- the body would be planned at each call).

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
        CHECK (run_at <@ '[1970-01-01 00:00:00+00,2500-01-01 00:00:00+00)'::tstzrange) NOT VALID,
    ADD CONSTRAINT jobs_backoff_range CHECK (
        least(backoff_base, backoff_factor, backoff_max, backoff_jitter) >= 0
        AND greatest(backoff_base, backoff_max, backoff_factor * 31536,
                     backoff_jitter * 31536000) <= 31536000) NOT VALID;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_run_at_range;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_backoff_range;

-- As in 0012, except: no ON CONFLICT without a dedup key, the queue's
-- registration read with the limits, the notification an assignment.
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
    v_known     boolean;
    v_queue     text;
    v_priority  integer;
    v_run_at    timestamptz;
    v_status    {schema}.job_status;
    v_backoff   real[];
    v_id        bigint;
    v_notified  text;
BEGIN
    IF p_lookup THEN
        SELECT g.* INTO v_registry FROM {schema}.tasks g WHERE g.name = p_task;
    END IF;
    v_queue := coalesce(p_queue, v_registry.queue, 'default');
    -- One statement reads the limits, whether the queue is registered and,
    -- when some operator priority setting exists, the task's.
    SELECT l.max_payload_bytes, l.max_queues IS NOT NULL OR l.max_queued_per_queue IS NOT NULL,
           CASE WHEN p_priority IS NULL AND EXISTS (
                    SELECT 1 FROM {schema}.task_settings s WHERE s.priority IS NOT NULL)
                THEN (SELECT s.priority FROM {schema}.task_settings s WHERE s.name = p_task) END,
           EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.name = v_queue)
    INTO v_max_bytes, v_quotas, v_setting, v_known
    FROM {schema}.limits l;
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

    IF p_dedup_key IS NULL THEN
        -- Nothing can conflict: a plain insert, no speculative insertion.
        INSERT INTO {schema}.jobs AS j (
            task, payload, queue, priority, run_at, status, max_attempts, lease_seconds,
            serial_key, backoff_base, backoff_factor, backoff_max, backoff_jitter)
        VALUES (p_task, p_payload, v_queue, v_priority, v_run_at, v_status,
                coalesce(p_max_attempts, v_registry.max_attempts, 5),
                coalesce(p_lease_seconds, v_registry.lease_seconds, 60),
                p_serial_key, v_backoff[1], v_backoff[2], v_backoff[3], v_backoff[4])
        RETURNING j.id INTO v_id;
        created := true;
    ELSE
        FOR attempt IN 1..10 LOOP
            INSERT INTO {schema}.jobs AS j (
                task, payload, queue, priority, run_at, status, max_attempts, lease_seconds,
                dedup_key, serial_key, backoff_base, backoff_factor, backoff_max, backoff_jitter)
            VALUES (p_task, p_payload, v_queue, v_priority, v_run_at, v_status,
                    coalesce(p_max_attempts, v_registry.max_attempts, 5),
                    coalesce(p_lease_seconds, v_registry.lease_seconds, 60),
                    p_dedup_key, p_serial_key, v_backoff[1], v_backoff[2], v_backoff[3],
                    v_backoff[4])
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
    END IF;
    IF created THEN
        -- Registered once; afterwards the look-up above, cheaper than ON CONFLICT.
        IF NOT v_known THEN
            INSERT INTO {schema}.queues (name) VALUES (v_queue) ON CONFLICT (name) DO NOTHING;
        END IF;
        -- An assignment, not PERFORM: evaluated as a simple expression.
        v_notified := {schema}.notify_enqueued(
            v_queue, 1, CASE WHEN v_status = 'queued' THEN 1 ELSE 0 END, v_id)::text;
    END IF;
    IF v_quotas THEN
        PERFORM {schema}.check_quotas(jsonb_build_array(jsonb_build_object('queue', v_queue)));
    END IF;
    job_id := v_id;
    RETURN NEXT;
END;
$$;
