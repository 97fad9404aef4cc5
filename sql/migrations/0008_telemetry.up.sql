-- pgqueue revision 0008: the W3C trace context of each job (OpenTelemetry).
--
-- A producer that traces stores the context of its `send <queue>` span with
-- the jobs it enqueues, and the worker runs each job in a span whose parent
-- is that context, so one trace follows a request into its background jobs.
--
-- The column takes its value from the setting pgqueue.trace_context, which
-- enqueue_batch_traced and enqueue(traceparent => ...) set for the length of
-- their own call only (they put the old value back). So the
-- enqueue functions themselves keep their bodies, and an insert that sets
-- nothing (replay, schedules, an untraced producer) stores NULL. A caller
-- may also scope it to a transaction itself:
--   SELECT set_config('pgqueue.trace_context', '{"traceparent": "00-..."}', true);
ALTER TABLE {schema}.jobs
    ADD COLUMN trace_context jsonb
    DEFAULT nullif(current_setting('pgqueue.trace_context', true), '')::jsonb;

-- enqueue_batch (or, for jobs with dedup_window/debounce, enqueue_windowed)
-- with the carrier (e.g. {"traceparent": ..., "tracestate": ...}) stored with
-- every job of the batch. Runs with the caller's rights: the function it
-- calls does the privileged part.
CREATE FUNCTION {schema}.enqueue_batch_traced(
    p_jobs jsonb, p_trace_context jsonb, p_windowed boolean DEFAULT false
)
RETURNS TABLE (job_id bigint, created boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_context text := current_setting('pgqueue.trace_context', true);
BEGIN
    IF p_trace_context IS NOT NULL AND (jsonb_typeof(p_trace_context) <> 'object'
                                        OR octet_length(p_trace_context::text) > 4096) THEN
        RAISE EXCEPTION 'pgqueue: trace context must be a JSON object of at most 4096 bytes'
            USING ERRCODE = '22023';
    END IF;
    -- For this call only: the old value is put back (an error aborts the
    -- transaction or savepoint, which puts it back too).
    PERFORM pg_catalog.set_config('pgqueue.trace_context', coalesce(p_trace_context::text, ''), true);
    IF p_windowed THEN
        RETURN QUERY SELECT b.job_id, b.created FROM {schema}.enqueue_windowed(p_jobs) b;
    ELSE
        RETURN QUERY SELECT b.job_id, b.created FROM {schema}.enqueue_batch(p_jobs) b;
    END IF;
    PERFORM pg_catalog.set_config('pgqueue.trace_context', coalesce(v_context, ''), true);
END;
$$;

-- enqueue and lease_jobs change their signature or result, so they are
-- dropped and created again: whoever could execute them keeps that right
-- (PUBLIC included, or not).
CREATE TEMPORARY TABLE pgqueue_0008_grants ON COMMIT DROP AS
SELECT p.proname::text AS function,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.oid IN ('{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval)'::regprocedure,
                '{schema}.lease_jobs(text[], text, integer, integer, timestamptz)'::regprocedure)
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval);
DROP FUNCTION {schema}.lease_jobs(text[], text, integer, integer, timestamptz);

-- The SQL API takes a W3C traceparent ('00-<trace id>-<span id>-<flags>').
-- Same body as 0007 plus that parameter.
CREATE FUNCTION {schema}.enqueue(
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

-- lease_jobs also returns each job's run_at and trace context (for the
-- worker's wait-time histogram and its trace spans). Same body as 0001 with
-- the settings of 0004, plus those two columns, which the UPDATE ... RETURNING
-- reads anyway; the plain lease query does not select them.
CREATE FUNCTION {schema}.lease_jobs(
    p_queues    text[],
    p_worker_id text,
    p_limit     integer,
    p_lease_seconds integer DEFAULT NULL,   -- NULL: each job's own lease_seconds
    p_now       timestamptz DEFAULT NULL
) RETURNS TABLE (
    job_id           bigint,
    attempt_id       bigint,
    attempt          integer,
    task             text,
    queue            text,
    payload          jsonb,
    lease_expires_at timestamptz,
    lease_seconds    integer,
    run_at           timestamptz,
    trace_context    jsonb
)
LANGUAGE plpgsql
-- The plan settings of 0004 (cached plans pinned to their indexes).
SET plan_cache_mode = auto
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := coalesce(p_now, clock_timestamp());
    v_left    integer := p_limit;
    v_cap     integer;
    v_got     integer;
    v_queue   record;
    v_ctl     record;
    v_staged  text[];
BEGIN
    -- Stage due scheduled jobs (any queue); other queues' workers are told.
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
        WHERE NOT q.paused AND (p_queues IS NULL OR q.name = ANY (p_queues))
        ORDER BY random()   -- no queue is always served first
    LOOP
        EXIT WHEN v_left <= 0;
        v_cap := v_left;

        IF v_queue.limited THEN
            SELECT q.paused, q.concurrency_limit, q.rate_limit, q.rate_period INTO v_ctl
            FROM {schema}.queues q WHERE q.name = v_queue.name
            FOR UPDATE;
            CONTINUE WHEN v_ctl.paused;
            IF p_now IS NULL THEN
                v_now := clock_timestamp();  -- leases of this queue are ordered by the lock
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
            -- MATERIALIZED keeps LIMIT + SKIP LOCKED in one scan; inlined, the
            -- planner may re-run the subquery per joined row.
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
            lease_expires_at = v_now + make_interval(secs => coalesce(p_lease_seconds, j.lease_seconds))
        -- = ANY(ARRAY(...)): primary-key lookups; a join lets the planner
        -- hash the whole table instead.
        WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING j.id, j.attempt_id, j.attempts, j.task, j.queue, j.payload, j.lease_expires_at,
                  coalesce(p_lease_seconds, j.lease_seconds) AS lease_seconds, j.priority, j.run_at,
                  j.trace_context
        )
        SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
               l.lease_seconds, l.run_at, l.trace_context
        FROM leased l
        ORDER BY l.priority DESC, l.run_at, l.id;  -- the batch in DESIGN order

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

REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text),
    {schema}.lease_jobs(text[], text, integer, integer, timestamptz)
FROM PUBLIC;

DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN SELECT function, grantee FROM pgqueue_0008_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s',
                       CASE v_grant.function
                           WHEN 'enqueue' THEN '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text)'
                           ELSE '{schema}.lease_jobs(text[], text, integer, integer, timestamptz)'
                       END,
                       v_grant.grantee);
    END LOOP;
END;
$$;
