-- Reverts 0008_telemetry: the SQL API without traceparent (the 0007 body),
-- lease_jobs without run_at and trace_context (the 0001 body with the 0004
-- settings), no enqueue_batch_traced, no trace_context column. Whoever
-- could execute enqueue and lease_jobs keeps that right.
CREATE TEMPORARY TABLE pgqueue_0008_grants ON COMMIT DROP AS
SELECT p.proname::text AS function,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.oid IN ('{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text)'::regprocedure,
                '{schema}.lease_jobs(text[], text, integer, integer, timestamptz)'::regprocedure)
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text);
DROP FUNCTION {schema}.lease_jobs(text[], text, integer, integer, timestamptz);

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
    debounce     interval DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF dedup_window IS NOT NULL OR debounce IS NOT NULL THEN
        PERFORM {schema}.dedup_lock(ARRAY[{schema}.dedup_lock_key(queue, dedup_key)]);
        v_id := {schema}.dedup_claim(queue, dedup_key, dedup_window, debounce, payload);
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
        IF debounce IS NOT NULL THEN
            run_at := now() + debounce;
        END IF;
    END IF;
    RETURN {schema}.enqueue_plain(task, payload, queue, priority, run_at, max_attempts,
                                  dedup_key, serial_key);
END;
$$;

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
    lease_seconds    integer
)
LANGUAGE plpgsql
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
                  coalesce(p_lease_seconds, j.lease_seconds) AS lease_seconds, j.priority, j.run_at
        )
        SELECT l.id, l.attempt_id, l.attempts, l.task, l.queue, l.payload, l.lease_expires_at,
               l.lease_seconds
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
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval),
    {schema}.lease_jobs(text[], text, integer, integer, timestamptz)
FROM PUBLIC;

DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN SELECT function, grantee FROM pgqueue_0008_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s',
                       CASE v_grant.function
                           WHEN 'enqueue' THEN '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval)'
                           ELSE '{schema}.lease_jobs(text[], text, integer, integer, timestamptz)'
                       END,
                       v_grant.grantee);
    END LOOP;
END;
$$;

DROP FUNCTION {schema}.enqueue_batch_traced(jsonb, jsonb, boolean);

ALTER TABLE {schema}.jobs DROP COLUMN trace_context;
