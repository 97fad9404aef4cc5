-- Reverts 0012_fast_enqueue: enqueue_job and enqueue_payloads go; enqueue_plain (0006) and
-- dedup_claim (0007) get their previous bodies back.

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

CREATE OR REPLACE FUNCTION {schema}.enqueue_plain(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT NULL,
    priority     integer DEFAULT NULL,
    run_at       timestamptz DEFAULT now(),
    max_attempts integer DEFAULT NULL,
    dedup_key    text DEFAULT NULL,
    serial_key   text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        -- Before jsonb_build_object, which would drop a JSON null.
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    PERFORM {schema}.check_job(NULL, task, payload, coalesce(queue, 'default'), priority,
                               coalesce(run_at, now()), NULL, max_attempts, NULL, dedup_key,
                               serial_key, NULL,
                               coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576));
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key, 'lookup', true)))) AS b;
    RETURN v_id;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.dedup_claim(
    p_queue text, p_key text, p_window interval, p_debounce interval, p_payload jsonb
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION 'pgqueue: dedup_window and debounce need a dedup_key'
            USING ERRCODE = '22023';
    END IF;
    IF p_window IS NOT NULL AND p_debounce IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue: give dedup_window or debounce, not both'
            USING ERRCODE = '22023';
    END IF;
    IF p_window <= interval '0' THEN
        RAISE EXCEPTION 'pgqueue: dedup_window must be positive, got %', p_window
            USING ERRCODE = '22023';
    END IF;
    IF p_debounce < interval '0' THEN
        RAISE EXCEPTION 'pgqueue: debounce must not be negative, got %', p_debounce
            USING ERRCODE = '22023';
    END IF;

    IF p_debounce IS NOT NULL THEN
        IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' THEN
            RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
        END IF;
        IF jsonb_path_exists(p_payload,
                'strict $.**{256 to last} ? (@.type() == "object" || @.type() == "array")') THEN
            RAISE EXCEPTION 'pgqueue: payload is nested deeper than 256 arrays/objects'
                USING ERRCODE = '22023';
        END IF;
        UPDATE {schema}.jobs j
        SET payload = p_payload,
            run_at = now() + p_debounce,
            status = CASE WHEN p_debounce > interval '0' THEN 'scheduled' ELSE 'queued' END::{schema}.job_status
        WHERE j.queue = p_queue AND j.dedup_key = p_key AND j.status IN ('queued', 'scheduled')
        RETURNING j.id INTO v_id;
        IF v_id IS NOT NULL THEN
            -- Idle workers recompute when to wake up.
            PERFORM pg_notify({channel}, 'j:' || p_queue);
        END IF;
        RETURN v_id;
    END IF;

    SELECT j.id INTO v_id FROM {schema}.jobs j
    WHERE j.queue = p_queue AND j.dedup_key = p_key AND j.created_at > now() - p_window
    ORDER BY j.created_at DESC LIMIT 1;
    IF v_id IS NULL THEN
        SELECT a.id INTO v_id FROM {schema}.jobs_archive a
        WHERE a.queue = p_queue AND a.dedup_key = p_key AND a.created_at > now() - p_window
        ORDER BY a.created_at DESC LIMIT 1;
    END IF;
    RETURN v_id;
END;
$$;

DROP FUNCTION {schema}.enqueue_payloads(jsonb, jsonb);
DROP FUNCTION {schema}.enqueue_job(text, jsonb, text, integer, timestamptz, float8, integer, integer,
                                   text, text, real[], boolean, integer);
