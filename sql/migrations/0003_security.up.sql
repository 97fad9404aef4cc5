-- pgqueue least privilege and input limits, revision 0003.
--
-- A producer role (`pgqueue grant --producer`) has no write privilege on any
-- table: it enqueues through the two enqueue functions, which therefore run
-- with the rights of their owner (the role that migrated) -- SECURITY
-- DEFINER. Such a function must not resolve names through its caller's
-- search_path, or a caller could shadow a function or operator it uses with
-- one of its own and run that as the owner; so the search_path is pinned to
-- pg_catalog, with pg_temp last (a temporary object can then shadow nothing).
-- Every pgqueue object in their bodies (and in enqueue_rows, which
-- enqueue_batch calls) is schema-qualified already.
--
-- EXECUTE on them is revoked from PUBLIC: only roles given a pgqueue role may
-- enqueue. enqueue_rows is internal (only enqueue_batch calls it, as owner).

-- The SQL API (same signature as 0001), now also refusing what would break
-- later instead of now:
--   * keys longer than 1024 bytes: the btree entry of the dedup/serial-key
--     index holds at most ~2700 bytes, and a longer key failed with
--     "index row size exceeds btree maximum";
--   * payloads nested deeper than 256 arrays/objects: PostgreSQL stores far
--     deeper ones, but Python's json module (what psycopg uses to read jsonb)
--     gives up near its recursion limit (~1000 levels), so such a job could
--     never be leased by a Python worker, nor read by get_job.
--     Keep 256 equal to pgqueue.payloads.MAX_PAYLOAD_DEPTH.
CREATE OR REPLACE FUNCTION {schema}.enqueue(
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

ALTER FUNCTION {schema}.enqueue_batch(jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text),
    {schema}.enqueue_batch(jsonb),
    {schema}.enqueue_rows(jsonb, bigint[])
FROM PUBLIC;
