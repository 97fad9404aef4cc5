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

-- enqueue changes its signature, so it is
-- dropped and created again: whoever could execute them keeps that right
-- (PUBLIC included, or not).
CREATE TEMPORARY TABLE pgqueue_0008_grants ON COMMIT DROP AS
SELECT p.proname::text AS function,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.oid IN ('{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval)'::regprocedure)
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval);

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


-- The worker's lease when it keeps metrics or traces: lease_jobs plus how
-- long each job waited (run_at to lease, by the server's clock) and its trace
-- context. Read in a second statement, whose snapshot sees every job
-- lease_jobs took (one statement's snapshot would predate jobs committed
-- while lease_jobs ran, and lose their trace context).
CREATE FUNCTION {schema}.lease_jobs_observed(
    p_queues        text[],
    p_worker_id     text,
    p_limit         integer,
    p_lease_seconds integer DEFAULT NULL,
    p_now           timestamptz DEFAULT NULL
) RETURNS TABLE (
    job_id           bigint,
    attempt_id       bigint,
    attempt          integer,
    task             text,
    queue            text,
    payload          jsonb,
    lease_expires_at timestamptz,
    lease_seconds    integer,
    wait_seconds     double precision,
    trace_context    jsonb
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_leased jsonb;
BEGIN
    SELECT coalesce(jsonb_agg(to_jsonb(l) ORDER BY l.ordinality), '[]'::jsonb) INTO v_leased
    FROM {schema}.lease_jobs(p_queues, p_worker_id, p_limit, p_lease_seconds, p_now)
         WITH ORDINALITY AS l;
    RETURN QUERY
    SELECT (x.e->>'job_id')::bigint, (x.e->>'attempt_id')::bigint, (x.e->>'attempt')::integer,
           x.e->>'task', x.e->>'queue', x.e->'payload',
           (x.e->>'lease_expires_at')::timestamptz, (x.e->>'lease_seconds')::integer,
           extract(epoch FROM (x.e->>'lease_expires_at')::timestamptz
                              - make_interval(secs => (x.e->>'lease_seconds')::integer)
                              - j.run_at)::double precision,
           j.trace_context
    FROM jsonb_array_elements(v_leased) WITH ORDINALITY AS x(e, n)
    LEFT JOIN {schema}.jobs j ON j.id = (x.e->>'job_id')::bigint
    ORDER BY x.n;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text),
    {schema}.enqueue_batch_traced(jsonb, jsonb, boolean),
    {schema}.lease_jobs_observed(text[], text, integer, integer, timestamptz)
FROM PUBLIC;

DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN SELECT function, grantee FROM pgqueue_0008_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s',
                       '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text)',
                       v_grant.grantee);
    END LOOP;
END;
$$;
