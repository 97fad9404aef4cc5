-- Reverts 0008_telemetry: the SQL API without traceparent (the 0003 body),
-- no enqueue_batch_traced, no trace_context column. Roles that could execute
-- enqueue keep that right.
CREATE TEMPORARY TABLE pgqueue_0008_enqueue_grantees ON COMMIT DROP AS
SELECT a.grantee::regrole::text AS grantee
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL aclexplode(p.proacl) a
WHERE p.oid = '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, text)'::regprocedure
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, text);

CREATE FUNCTION {schema}.enqueue(
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
    SELECT b.job_id INTO v_id
    FROM {schema}.enqueue_batch(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
        'task', task, 'payload', payload, 'queue', queue, 'priority', priority,
        'run_at', coalesce(run_at, now()), 'max_attempts', max_attempts,
        'dedup_key', dedup_key, 'serial_key', serial_key)))) AS b;
    RETURN v_id;
END;
$$;

REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text)
FROM PUBLIC;

DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN SELECT grantee FROM pgqueue_0008_enqueue_grantees LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text) '
                       'TO %s', v_grantee);
    END LOOP;
END;
$$;

DROP FUNCTION {schema}.enqueue_batch_traced(jsonb, jsonb);

ALTER TABLE {schema}.jobs DROP COLUMN trace_context;
