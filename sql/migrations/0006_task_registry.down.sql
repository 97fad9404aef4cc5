-- Reverts 0006_task_registry: no registry, settings or per-task limits;
-- enqueue_input, enqueue_plain, lease_jobs, fail_jobs and reap_jobs as of
-- 0005, enqueue as of 0008. (max_attempts 0, unlimited, is 0005's too.)
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

DROP FUNCTION {schema}.publish_tasks(text, text[], text[], smallint[], integer[], integer[], float8[], real[], real[], real[], real[]);

CREATE OR REPLACE FUNCTION {schema}.enqueue_input(p_jobs jsonb)
RETURNS TABLE (
    ord bigint, task text, payload jsonb, queue text, priority smallint, run_at timestamptz,
    status {schema}.job_status, max_attempts integer, lease_seconds integer, dedup_key text,
    serial_key text, backoff_base real, backoff_factor real, backoff_max real,
    backoff_jitter real
)
LANGUAGE sql STABLE AS $$
    SELECT r.ord, r.task, coalesce(r.payload, '{}'::jsonb), coalesce(r.queue, 'default'),
           coalesce(r.priority, 0)::smallint, t.run_at,
           CASE WHEN t.run_at > now() THEN 'scheduled' ELSE 'queued' END::{schema}.job_status,
           coalesce(r.max_attempts, 5), coalesce(r.lease_seconds, 60), r.dedup_key, r.serial_key,
           r.backoff[1], r.backoff[2], r.backoff[3], r.backoff[4]
    FROM ROWS FROM (jsonb_to_recordset(p_jobs) AS (
        task text, payload jsonb, queue text, priority integer,
        run_at timestamptz, delay float8, max_attempts integer, lease_seconds integer,
        dedup_key text, serial_key text, backoff real[]))
        WITH ORDINALITY AS r(task, payload, queue, priority, run_at, delay, max_attempts,
                             lease_seconds, dedup_key, serial_key, backoff, ord)
    -- delay is added to the database clock, never the client's.
    CROSS JOIN LATERAL (SELECT coalesce(r.run_at, now() + make_interval(secs => CASE
                            WHEN r.delay BETWEEN 0 AND 3153600000 THEN coalesce(r.delay, 0) ELSE 0 END))
                        AS run_at) t
    -- The common case is decided by plain expressions (no function call per
    -- row); anything else goes to check_job, which names the problem.
    -- (No bounded repetitions like {1,255} in the patterns: PostgreSQL's
    -- regex engine makes them ~100 times slower than a length check.)
    WHERE CASE WHEN length(r.task) BETWEEN 1 AND 255 AND r.task !~ '[[:cntrl:]]'
                    AND btrim(r.task) <> ''
                    AND length(coalesce(r.queue, 'default')) BETWEEN 1 AND 128
                    AND coalesce(r.queue, 'default') !~ '[^A-Za-z0-9_.:-]'
                    AND jsonb_typeof(coalesce(r.payload, '{}'::jsonb)) = 'object'
                    AND pg_column_size(coalesce(r.payload, '{}'::jsonb)) * 8 <= least(8000,
                            (SELECT l.max_payload_bytes FROM {schema}.limits l))
                    AND (r.dedup_key IS NULL OR octet_length(r.dedup_key) BETWEEN 1 AND 1024)
                    AND (r.serial_key IS NULL OR octet_length(r.serial_key) BETWEEN 1 AND 1024)
                    AND (r.priority IS NULL OR r.priority BETWEEN -32768 AND 32767)
                    AND (r.delay IS NULL OR r.delay BETWEEN 0 AND 3153600000)
                    AND t.run_at >= '1970-01-01 00:00:00+00' AND t.run_at < '2500-01-01 00:00:00+00'
                    AND (r.max_attempts IS NULL OR r.max_attempts >= 0)
                    AND (r.lease_seconds IS NULL OR r.lease_seconds >= 1)
                    AND r.backoff IS NULL
               THEN true
               ELSE {schema}.check_job(
        CASE WHEN jsonb_array_length(p_jobs) > 1 THEN r.ord END, r.task,
        coalesce(r.payload, '{}'::jsonb), coalesce(r.queue, 'default'), r.priority,
        CASE WHEN r.delay IS NULL OR r.delay BETWEEN 0 AND 3153600000 THEN t.run_at
             ELSE now() END,
        r.delay, r.max_attempts, r.lease_seconds, r.dedup_key, r.serial_key, r.backoff,
        coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576)) END
$$;

CREATE OR REPLACE FUNCTION {schema}.enqueue_plain(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT 'default',
    priority     integer DEFAULT 0,
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
    PERFORM {schema}.check_job(NULL, task, payload, queue, priority, coalesce(run_at, now()),
                               NULL, max_attempts, NULL, dedup_key, serial_key, NULL,
                               coalesce((SELECT l.max_payload_bytes FROM {schema}.limits l), 1048576));
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key)))) AS b;
    RETURN v_id;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.lease_jobs(
    p_queues    text[],
    p_worker_id text,
    p_limit     integer,
    p_lease_seconds integer DEFAULT NULL,
    p_now       timestamptz DEFAULT NULL
) RETURNS TABLE (
    job_id           bigint,
    attempt_id       bigint,
    attempt          integer,
    task             text,
    queue            text,
    payload          jsonb,
    lease_expires_at timestamptz,
    lease_seconds    integer
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    -- (A call only when a clock is passed: it costs more than the rest of an idle lease.)
    v_fixed   timestamptz := CASE WHEN p_now IS NOT NULL THEN {schema}.trusted_clock(p_now) END;
    v_now     timestamptz := coalesce(v_fixed, clock_timestamp());
    v_left    integer := least(coalesce(p_limit, 1), 10000);
    -- (greatest() would turn a NULL, "each job's own", into 1)
    v_lease   integer := CASE WHEN p_lease_seconds IS NOT NULL THEN greatest(p_lease_seconds, 1) END;
    v_cap     integer;
    v_got     integer;
    v_queue   record;
    v_ctl     record;
    v_staged  text[];
BEGIN
    WITH due AS MATERIALIZED (
        SELECT id FROM {schema}.jobs
        WHERE status = 'scheduled' AND run_at <= v_now
        ORDER BY run_at
        LIMIT 1000
        FOR UPDATE SKIP LOCKED
    ), staged AS (
        UPDATE {schema}.jobs j SET status = 'queued'
        WHERE j.id = ANY (ARRAY(SELECT id FROM due))
        RETURNING j.queue
    )
    SELECT array_agg(DISTINCT s.queue) INTO v_staged FROM staged s;
    IF v_staged IS NOT NULL THEN
        PERFORM pg_notify({channel}, 'j:' || s) FROM unnest(v_staged) s;
    END IF;

    FOR v_queue IN
        SELECT q.name, q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL AS limited
        FROM {schema}.queues q
        WHERE NOT q.paused AND q.name = ANY (CASE
            WHEN p_queues IS NOT NULL THEN p_queues
            -- Every queue: only those holding ready jobs, found by a loose
            -- index scan of the ready index (one probe per such queue).
            ELSE ARRAY(
                WITH RECURSIVE ready(name) AS (
                    (SELECT j.queue FROM {schema}.jobs j
                     WHERE j.status = 'queued' ORDER BY j.queue LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.queue FROM {schema}.jobs j
                            WHERE j.queue > r.name AND j.status = 'queued'
                            ORDER BY j.queue LIMIT 1)
                    FROM ready r WHERE r.name IS NOT NULL
                )
                SELECT r.name FROM ready r WHERE r.name IS NOT NULL)
            END)
        ORDER BY random()   -- no queue is always served first
    LOOP
        EXIT WHEN v_left <= 0;
        v_cap := v_left;

        IF v_queue.limited THEN
            SELECT q.paused, q.concurrency_limit, q.rate_limit, q.rate_period INTO v_ctl
            FROM {schema}.queues q WHERE q.name = v_queue.name
            FOR UPDATE;
            CONTINUE WHEN v_ctl.paused;
            IF v_fixed IS NULL THEN
                v_now := clock_timestamp();
            END IF;
            IF v_ctl.concurrency_limit IS NOT NULL THEN
                v_cap := least(v_cap, v_ctl.concurrency_limit - (
                    SELECT count(*) FROM {schema}.jobs j
                    WHERE j.queue = v_queue.name AND j.status = 'running'
                      AND j.lease_expires_at > v_now)::integer);
            END IF;
            IF v_ctl.rate_limit IS NOT NULL THEN
                DELETE FROM {schema}.queue_lease_log l
                WHERE l.queue = v_queue.name AND l.leased_at <= v_now - v_ctl.rate_period;
                v_cap := least(v_cap, v_ctl.rate_limit - (
                    SELECT count(*) FROM {schema}.queue_lease_log l
                    WHERE l.queue = v_queue.name)::integer);
            END IF;
            CONTINUE WHEN v_cap <= 0;
        END IF;

        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT j.id FROM {schema}.jobs j
            WHERE j.queue = v_queue.name AND j.status = 'queued' AND j.run_at <= v_now
              AND (j.serial_key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {schema}.jobs s
                    WHERE s.serial_key = j.serial_key
                      AND s.status IN ('queued', 'scheduled', 'running')
                      AND (s.id < j.id OR s.status = 'running')))
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT v_cap
            FOR UPDATE SKIP LOCKED
        )
        , leased AS (
        UPDATE {schema}.jobs j
        SET status = 'running',
            attempts = j.attempts + 1,
            attempt_id = nextval('{schema}.attempt_id_seq'),
            worker_id = p_worker_id,
            attempt_started_at = v_now,
            lease_expires_at = v_now + make_interval(secs => coalesce(v_lease, j.lease_seconds))
        WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                  coalesce(v_lease, j.lease_seconds) AS lease_seconds, j.priority, j.run_at
        )
        SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
               l.lease_seconds
        FROM leased l
        ORDER BY l.priority DESC, l.run_at, l.id;

        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
        IF v_queue.limited AND v_got > 0 THEN
            IF v_ctl.rate_limit IS NOT NULL THEN
                INSERT INTO {schema}.queue_lease_log (queue, leased_at)
                SELECT v_queue.name, v_now FROM generate_series(1, v_got);
            END IF;
        END IF;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.reap_jobs(p_limit integer, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (job_id bigint, status text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $2 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($2), now()) END AS now
), expired AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs j
    WHERE j.status = 'running' AND j.lease_expires_at < (SELECT now FROM clock)
    ORDER BY j.lease_expires_at
    LIMIT least(greatest($1, 1), 10000)
    FOR UPDATE SKIP LOCKED
), decided AS (
    SELECT j.id, j.attempt_id, j.attempts, j.worker_id, j.attempt_started_at, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                WHEN j.max_attempts > 0 AND j.attempts >= j.max_attempts THEN 'dead'
                ELSE 'retry' END AS next,
           least((SELECT now FROM clock)
               + {schema}.retry_delay(j.attempts, j.backoff_base, j.backoff_factor,
                                      j.backoff_max, j.backoff_jitter),
                 '2499-12-31 00:00:00+00') AS next_run_at
    FROM {schema}.jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM expired))
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN d.next = 'retry' THEN 'scheduled' ELSE d.next END::{schema}.job_status,
        run_at = CASE WHEN d.next = 'retry' THEN d.next_run_at ELSE j.run_at END,
        finished_at = CASE WHEN d.next = 'retry' THEN NULL ELSE (SELECT now FROM clock) END,
        lease_expires_at = NULL,
        last_error = 'lease_expired: worker ' || coalesce(d.worker_id, '?')
                     || ' did not finish or extend its lease'
    FROM decided d
    WHERE j.id = ANY (ARRAY(SELECT id FROM decided)) AND j.id = d.id
    RETURNING j.id, j.status, j.queue
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id, error_code, error_message)
    SELECT d.attempt_id, d.id, d.attempts,
           CASE WHEN d.next = 'cancelled' THEN 'cancelled' ELSE 'lease_expired' END::{schema}.attempt_outcome,
           d.attempt_started_at, (SELECT now FROM clock), d.worker_id,
           'lease_expired', 'lease expired while the job was running on worker '
                            || coalesce(d.worker_id, '?')
    FROM decided d
), notified AS (
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || u.id || ':' || u.status || ':' || u.queue AS payload
          FROM decided d JOIN updated u ON u.id = d.id
          WHERE d.notify_finish AND d.next <> 'retry'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u WHERE u.status = 'scheduled') n
)
SELECT u.id, u.status::text FROM updated u CROSS JOIN notified
$q$ USING p_limit, p_now;
END;
$$;

DROP FUNCTION {schema}.fail_jobs(bigint[], bigint[], text[], timestamptz[], float8[], boolean[], text[], text[], text[], timestamptz, float8[]);
CREATE FUNCTION {schema}.fail_jobs(
    p_job_ids bigint[], p_attempt_ids bigint[], p_outcomes text[], p_retry_ats timestamptz[],
    p_retry_delays float8[], p_permanent boolean[], p_error_codes text[],
    p_error_messages text[], p_tracebacks text[], p_now timestamptz DEFAULT NULL
) RETURNS TABLE (job_id bigint, attempt_id bigint, status text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXECUTE: planned for the arrays at hand on every call, as the
    -- statement was before; a cached generic plan joins them quadratically.
    RETURN QUERY EXECUTE $q$
WITH clock AS MATERIALIZED (
    SELECT CASE WHEN $10 IS NULL THEN now() ELSE coalesce({schema}.trusted_clock($10), now()) END AS now
), failed AS (
    SELECT f.job_id, f.attempt_id,
           CASE WHEN f.outcome IN ('failed', 'retry', 'timeout', 'cancelled', 'lease_expired')
                THEN f.outcome ELSE 'failed' END::{schema}.attempt_outcome AS outcome,
           f.retry_at, f.retry_delay, coalesce(f.permanent, false) AS permanent,
           coalesce(f.error_code, 'error') AS error_code, f.error_message, f.traceback
    FROM unnest($1, $2, $3, $4, $5, $6,
                $7, $8, $9)
        AS f(job_id, attempt_id, outcome, retry_at, retry_delay, permanent, error_code,
             error_message, traceback)
), decided AS (
    SELECT f.*, j.attempts, j.attempt_started_at, j.worker_id, j.notify_finish,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                WHEN f.permanent OR (j.max_attempts > 0 AND j.attempts >= j.max_attempts) THEN 'dead'
                ELSE 'retry' END AS next,
           least(greatest(coalesce(f.retry_at, c.now + coalesce(
               CASE WHEN f.retry_delay IS NOT NULL  -- (greatest() would turn NULL into 0)
                    THEN make_interval(secs => CASE WHEN f.retry_delay BETWEEN 0 AND 31536000
                                                    THEN f.retry_delay
                                                    WHEN f.retry_delay > 0 THEN 31536000
                                                    ELSE 0 END) END,
               {schema}.retry_delay(j.attempts, j.backoff_base, j.backoff_factor,
                                    j.backoff_max, j.backoff_jitter))), '1970-01-01 00:00:00+00'),
                 '2499-12-31 00:00:00+00') AS next_run_at
    FROM failed f
    CROSS JOIN clock c
    JOIN {schema}.jobs j ON j.id = f.job_id AND j.attempt_id = f.attempt_id AND j.status = 'running'
    WHERE j.id = ANY ($1)
    FOR UPDATE OF j
), updated AS (
    UPDATE {schema}.jobs j
    SET status = CASE d.next
            WHEN 'retry' THEN CASE WHEN d.next_run_at > (SELECT now FROM clock)
                                   THEN 'scheduled' ELSE 'queued' END
            ELSE d.next END::{schema}.job_status,
        run_at = CASE WHEN d.next = 'retry' THEN d.next_run_at ELSE j.run_at END,
        finished_at = CASE WHEN d.next = 'retry' THEN NULL ELSE (SELECT now FROM clock) END,
        lease_expires_at = NULL,
        last_error = left(d.error_code || ': ' || coalesce(d.error_message, ''), 2000)
    FROM decided d
    WHERE j.id = ANY ($1) AND j.id = d.job_id
    RETURNING j.id, j.attempt_id, j.status, j.queue
), attempts AS (
    INSERT INTO {schema}.job_attempts
        (id, job_id, attempt, outcome, started_at, finished_at, worker_id,
         error_code, error_message, traceback)
    SELECT d.attempt_id, d.job_id, d.attempts,
           CASE WHEN d.next = 'cancelled' THEN 'cancelled' ELSE d.outcome END,
           d.attempt_started_at, (SELECT now FROM clock), d.worker_id,
           d.error_code, d.error_message, d.traceback
    FROM decided d
), notified AS (
    -- Finished: tell result() waiters. Retried now: new ready work; retried
    -- later or a freed slot: the queue's workers recompute when to wake.
    SELECT count(pg_notify({channel}, n.payload)) AS n
    FROM (SELECT 'f:' || u.id || ':' || u.status || ':' || u.queue AS payload
          FROM decided d JOIN updated u ON u.id = d.job_id
          WHERE d.notify_finish AND d.next <> 'retry'
          UNION
          SELECT DISTINCT 'j:' || u.queue FROM updated u WHERE u.status = 'queued'
          UNION
          SELECT DISTINCT 'w:' || u.queue FROM updated u
          WHERE u.status = 'scheduled'
             OR u.queue IN (SELECT name FROM {schema}.queues WHERE concurrency_limit IS NOT NULL)) n
)
SELECT u.id, u.attempt_id, u.status::text FROM updated u CROSS JOIN notified
$q$ USING p_job_ids, p_attempt_ids, p_outcomes, p_retry_ats, p_retry_delays, p_permanent, p_error_codes, p_error_messages, p_tracebacks, p_now;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT 'default',
    priority     integer DEFAULT 0,
    run_at       timestamptz DEFAULT now(),
    max_attempts integer DEFAULT NULL,
    dedup_key    text DEFAULT NULL,
    serial_key   text DEFAULT NULL,
    dedup_window interval DEFAULT NULL,
    debounce     interval DEFAULT NULL,
    traceparent  text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id      bigint;
    v_context text;
BEGIN
    IF traceparent IS NOT NULL THEN
        IF traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
            RAISE EXCEPTION 'pgqueue: traceparent must be a W3C traceparent like 00-<32 hex>-<16 hex>-01, got %',
                    quote_literal(left(traceparent, 80))
                USING ERRCODE = '22023';
        END IF;
        -- Set for this call only: put back below (an error aborts the
        -- transaction or savepoint, which puts it back too).
        v_context := current_setting('pgqueue.trace_context', true);
        PERFORM set_config('pgqueue.trace_context',
                           jsonb_build_object('traceparent', traceparent)::text, true);
    END IF;
    IF dedup_window IS NOT NULL OR debounce IS NOT NULL THEN
        PERFORM {schema}.dedup_lock(ARRAY[{schema}.dedup_lock_key(queue, dedup_key)]);
        v_id := {schema}.dedup_claim(queue, dedup_key, dedup_window, debounce, payload);
        IF v_id IS NOT NULL THEN
            IF traceparent IS NOT NULL THEN
                PERFORM set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
            END IF;
            RETURN v_id;
        END IF;
        IF debounce IS NOT NULL THEN
            run_at := now() + debounce;
        END IF;
    END IF;
    v_id := {schema}.enqueue_plain(task, payload, queue, priority, run_at, max_attempts,
                                   dedup_key, serial_key);
    IF traceparent IS NOT NULL THEN
        PERFORM set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
    END IF;
    RETURN v_id;
END;
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;

ALTER TABLE {schema}.workers DROP COLUMN tasks, DROP COLUMN lost_at;
DROP INDEX {schema}.job_attempts_finished_idx;
DROP TABLE {schema}.task_lease_log;
DROP TABLE {schema}.task_settings;
DROP TABLE {schema}.tasks;
