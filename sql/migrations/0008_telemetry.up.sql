-- pgqueue revision 0008: the W3C trace context of each job (OpenTelemetry).
--
-- A producer that traces stores the context of its `send <queue>` span with
-- the jobs it enqueues, and the worker runs each job in a span whose parent
-- is that context, so one trace follows a request into its background jobs.
--
-- The column takes its value from the setting pgqueue.trace_context, which
-- enqueue_batch_traced and enqueue(traceparent => ...) set for the length of
-- their own call only (a function's SET clause restores it on exit). So the
-- enqueue functions themselves keep their bodies, and an insert that sets
-- nothing (replay, schedules, an untraced producer) stores NULL. A caller
-- may also scope it to a transaction itself:
--   SELECT set_config('pgqueue.trace_context', '{"traceparent": "00-..."}', true);
ALTER TABLE {schema}.jobs
    ADD COLUMN trace_context jsonb
    DEFAULT nullif(current_setting('pgqueue.trace_context', true), '')::jsonb;

-- enqueue_batch with the carrier (e.g. {"traceparent": ..., "tracestate": ...})
-- stored with every job of the batch. Runs with the caller's rights:
-- enqueue_batch does the privileged part.
CREATE FUNCTION {schema}.enqueue_batch_traced(p_jobs jsonb, p_trace_context jsonb)
RETURNS TABLE (job_id bigint, created boolean)
LANGUAGE plpgsql
SET pgqueue.trace_context = ''
AS $$
BEGIN
    IF p_trace_context IS NOT NULL AND (jsonb_typeof(p_trace_context) <> 'object'
                                        OR octet_length(p_trace_context::text) > 4096) THEN
        RAISE EXCEPTION 'pgqueue: trace context must be a JSON object of at most 4096 bytes'
            USING ERRCODE = '22023';
    END IF;
    PERFORM pg_catalog.set_config('pgqueue.trace_context', coalesce(p_trace_context::text, ''), true);
    RETURN QUERY SELECT b.job_id, b.created FROM {schema}.enqueue_batch(p_jobs) b;
END;
$$;

-- The SQL API takes a W3C traceparent ('00-<trace id>-<span id>-<flags>').
-- Same body as 0003 plus that parameter. A new signature means a new
-- function: the roles that could execute the old one keep that right.
CREATE TEMPORARY TABLE pgqueue_0008_enqueue_grantees ON COMMIT DROP AS
SELECT a.grantee::regrole::text AS grantee
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL aclexplode(p.proacl) a
WHERE p.oid = '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text)'::regprocedure
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text);

CREATE FUNCTION {schema}.enqueue(
    task         text,
    payload      jsonb DEFAULT '{}',
    queue        text DEFAULT 'default',
    priority     integer DEFAULT 0,
    run_at       timestamptz DEFAULT now(),
    max_attempts integer DEFAULT NULL,
    dedup_key    text DEFAULT NULL,
    serial_key   text DEFAULT NULL,
    traceparent  text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET pgqueue.trace_context = ''
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF task IS NULL OR btrim(task) = '' OR length(task) > 255 OR task ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgqueue: invalid task name %', quote_literal(left(coalesce(task, 'NULL'), 80))
            USING ERRCODE = '22023',
                  HINT = 'task names are 1 to 255 characters without control characters';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'pgqueue: invalid queue name %', quote_literal(left(coalesce(queue, 'NULL'), 140))
            USING ERRCODE = '22023',
                  HINT = 'queue names are 1 to 128 characters from A-Z a-z 0-9 _ . : -';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'pgqueue: payload must be a JSON object'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_path_exists(payload,
            'strict $.**{256 to last} ? (@.type() == "object" || @.type() == "array")') THEN
        RAISE EXCEPTION 'pgqueue: payload is nested deeper than 256 arrays/objects'
            USING ERRCODE = '22023';
    END IF;
    IF dedup_key = '' OR serial_key = '' THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be NULL or non-empty'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(dedup_key) > 1024 OR octet_length(serial_key) > 1024 THEN
        RAISE EXCEPTION 'pgqueue: dedup_key and serial_key must be at most 1024 bytes'
            USING ERRCODE = '22023';
    END IF;
    IF max_attempts IS NOT NULL AND max_attempts < 1 THEN
        RAISE EXCEPTION 'pgqueue: max_attempts must be at least 1'
            USING ERRCODE = '22023';
    END IF;
    IF priority IS NULL OR priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'pgqueue: priority must be a smallint'
            USING ERRCODE = '22023';
    END IF;
    IF traceparent IS NOT NULL THEN
        IF traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
            RAISE EXCEPTION 'pgqueue: traceparent must be a W3C traceparent like 00-<32 hex>-<16 hex>-01, got %',
                    quote_literal(left(traceparent, 80))
                USING ERRCODE = '22023';
        END IF;
        PERFORM set_config('pgqueue.trace_context',
                           jsonb_build_object('traceparent', traceparent)::text, true);
    END IF;
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key)))) AS b;
    RETURN v_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, text)
FROM PUBLIC;

DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN SELECT grantee FROM pgqueue_0008_enqueue_grantees LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, text) '
                       'TO %s', v_grantee);
    END LOOP;
END;
$$;
