-- pgqueue revision 0012: a fast path for one job, and debounce checks its payload.
--
-- * enqueue_job: one job from scalar arguments (no JSON document to build,
--   parse and unpack), in one SECURITY DEFINER call whose statements keep
--   cached plans. It applies exactly what enqueue_batch applies to a
--   one-job array (enqueue_input's defaults, plain-expression validation
--   with check_job naming the problem, race-free dedup, queue registration,
--   one notification, quotas). The Python App uses it for every single
--   enqueue without dedup_window/debounce or a trace context; the SQL API's
--   plain path (enqueue_plain, behind enqueue()) calls it too.
-- * enqueue_payloads: a batch whose jobs differ only in their payload (the
--   common bulk enqueue: one task, many payloads). The shared fields are
--   validated and defaulted once (enqueue_input of one job), the payloads
--   arrive as one JSON array (a tenth of the bytes of an array of job
--   objects to parse) and are checked set-wise, the ids come back as one
--   array in input order. All or nothing; one notification.
-- * dedup_claim (0007): the debounce path replaced a queued job's payload
--   checking only its shape. It now refuses what every other enqueue path
--   refuses: a payload over limits.max_payload_bytes, and a debounce that
--   puts run_at past the range every job must be in (at most 100 years,
--   like a delay). A windowed enqueue now keeps DESIGN's "at most one job
--   per key created within the window, finished or not" for live jobs too:
--   a live job created before the window gives its key up (dedup_key
--   cleared) instead of holding it for as long as it stays queued, so a
--   far-future job squats a key for at most the window.

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

-- Defaults field by field as in enqueue_input (0006), first wins: the
-- argument; the operator's priority setting; the producer's code
-- (p_default_priority); the task registry (only with p_lookup: the producer
-- did not know the task); the built-in defaults. Every statement here keeps
-- a cached plan (plan_cache_mode = auto over the session's
-- force_custom_plan): a single enqueue is too small for planning to pay.
CREATE FUNCTION {schema}.enqueue_job(
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

-- Enqueue one job per element of p_payloads (a JSON array of objects; a
-- JSON null stands for {} as in a job object), every job with the fields of
-- p_job (a job object as in enqueue_batch, without payload and without
-- dedup_key, dedup_window or debounce: those are per job). Returns the new
-- ids in input order. Everything is validated before the first id is drawn.
CREATE FUNCTION {schema}.enqueue_payloads(p_job jsonb, p_payloads jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto
SET jit = off
AS $$
DECLARE
    v_job       record;
    v_count     integer;
    v_max_bytes integer;
    v_quotas    boolean;
    v_ids       bigint[];
BEGIN
    IF jsonb_typeof(p_job) IS DISTINCT FROM 'object'
       OR p_job ?| ARRAY['payload', 'dedup_key', 'dedup_window', 'debounce'] THEN
        RAISE EXCEPTION 'pgqueue: enqueue_payloads takes a job object without payload, dedup_key, dedup_window or debounce'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p_payloads) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'pgqueue: enqueue_payloads takes a JSON array of payloads'
            USING ERRCODE = '22023';
    END IF;
    v_count := jsonb_array_length(p_payloads);
    IF v_count = 0 THEN
        RETURN '{}';
    END IF;
    SELECT l.max_payload_bytes, l.max_queues IS NOT NULL OR l.max_queued_per_queue IS NOT NULL
    INTO v_max_bytes, v_quotas FROM {schema}.limits l;
    -- The shared fields: checked and defaulted once, exactly as for one job.
    SELECT i.* INTO v_job FROM {schema}.enqueue_input(jsonb_build_array(p_job)) i;
    -- Every payload, before any id is drawn: plain expressions, else
    -- check_job names the problem and the job.
    PERFORM count(*)
    FROM jsonb_array_elements(p_payloads) WITH ORDINALITY AS e(payload, ord)
    WHERE NOT coalesce(jsonb_typeof(e.payload) IN ('object', 'null')
                       AND pg_column_size(e.payload) * 8 <= least(8000, v_max_bytes), false)
      AND {schema}.check_job(
              CASE WHEN v_count > 1 THEN e.ord END, v_job.task, e.payload, v_job.queue,
              v_job.priority, v_job.run_at, NULL, v_job.max_attempts, v_job.lease_seconds,
              NULL, v_job.serial_key, NULL, coalesce(v_max_bytes, 1048576));

    -- jsonb_array_elements yields the payloads in order and nextval runs in
    -- that order: sorted ids are input order.
    WITH inserted AS (
        INSERT INTO {schema}.jobs AS j (
            id, task, payload, queue, priority, run_at, status, max_attempts, lease_seconds,
            serial_key, backoff_base, backoff_factor, backoff_max, backoff_jitter)
        SELECT nextval('{schema}.jobs_id_seq'), v_job.task,
               CASE WHEN jsonb_typeof(e.payload) = 'null' THEN '{}'::jsonb ELSE e.payload END,
               v_job.queue, v_job.priority, v_job.run_at, v_job.status, v_job.max_attempts,
               v_job.lease_seconds, v_job.serial_key, v_job.backoff_base, v_job.backoff_factor,
               v_job.backoff_max, v_job.backoff_jitter
        FROM jsonb_array_elements(p_payloads) AS e(payload)
        RETURNING j.id
    )
    SELECT array_agg(i.id ORDER BY i.id) INTO v_ids FROM inserted i;

    IF NOT EXISTS (SELECT 1 FROM {schema}.queues q WHERE q.name = v_job.queue) THEN
        INSERT INTO {schema}.queues (name) VALUES (v_job.queue) ON CONFLICT (name) DO NOTHING;
    END IF;
    PERFORM {schema}.notify_enqueued(v_job.queue, v_count,
                                     CASE WHEN v_job.status = 'queued' THEN v_count ELSE 0 END,
                                     v_ids[1]);
    IF v_quotas THEN
        PERFORM {schema}.check_quotas(jsonb_build_array(jsonb_build_object('queue', v_job.queue)));
    END IF;
    RETURN v_ids;
END;
$$;

-- The SQL API's plain path (behind enqueue()), as in 0006, through enqueue_job.
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
BEGIN
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    RETURN (SELECT e.job_id FROM {schema}.enqueue_job(
        task, payload, queue, priority, coalesce(run_at, now()), NULL, max_attempts, NULL,
        dedup_key, serial_key, NULL, true, NULL) e);
END;
$$;

-- As in 0007, plus: a debounced payload is held to the size limit, the
-- debounce to at most 100 years (run_at stays in the range of every job), and
-- a windowed enqueue takes the key from a live job created before the window.
CREATE OR REPLACE FUNCTION {schema}.dedup_claim(
    p_queue text, p_key text, p_window interval, p_debounce interval, p_payload jsonb
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id    bigint;
    v_limit integer;
    v_size  integer;
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
        IF p_debounce > make_interval(secs => 3153600000) THEN
            RAISE EXCEPTION 'pgqueue: debounce must be at most 3153600000 seconds (100 years), got %', p_debounce
                USING ERRCODE = '22023';
        END IF;
        IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' THEN
            RAISE EXCEPTION 'pgqueue: payload must be a JSON object' USING ERRCODE = '22023';
        END IF;
        -- The size limit, measured as check_job measures it.
        v_limit := coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576);
        IF pg_column_size(p_payload) > v_limit / 8 THEN
            v_size := octet_length(p_payload::text);
            IF v_size > v_limit THEN
                RAISE EXCEPTION 'pgqueue: payload is % bytes of JSON, over the %-byte limit',
                    v_size, v_limit USING ERRCODE = '22023';
            END IF;
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
    IF v_id IS NULL THEN
        -- "At most one job per key created within the window, finished or
        -- not": a live job created before the window no longer holds the key
        -- (else a far-future job would squat it for ever). It keeps running
        -- without it; the caller holds the key's dedup lock.
        UPDATE {schema}.jobs j SET dedup_key = NULL
        WHERE j.queue = p_queue AND j.dedup_key = p_key
          AND j.status IN ('queued', 'scheduled', 'running')
          AND j.created_at <= now() - p_window;
    END IF;
    RETURN v_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue_job(text, jsonb, text, integer, timestamptz, float8, integer, integer,
                         text, text, real[], boolean, integer),
    {schema}.enqueue_payloads(jsonb, jsonb)
FROM PUBLIC;

-- Roles that could enqueue keep that right through the new function
-- (`pgqueue migrate` also re-applies recorded grants).
DO $grants$
DECLARE
    v_role text;
BEGIN
    FOR v_role IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = '{schema}.enqueue_batch(jsonb)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.enqueue_job(text, jsonb, text, integer, '
                       'timestamptz, float8, integer, integer, text, text, real[], boolean, integer) TO %s',
                       v_role);
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.enqueue_payloads(jsonb, jsonb) TO %s', v_role);
    END LOOP;
END;
$grants$;
