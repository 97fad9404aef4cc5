-- Reverts 0008_telemetry: the SQL API without traceparent (the 0007 body),
-- no enqueue_batch_traced, no trace_context column. Whoever could execute
-- enqueue keeps that right.
CREATE TEMPORARY TABLE pgqueue_0008_grants ON COMMIT DROP AS
SELECT p.proname::text AS function,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
FROM pg_catalog.pg_proc p
CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.oid IN ('{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text)'::regprocedure)
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner;

DROP FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval, text);

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


REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval)
FROM PUBLIC;

DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN SELECT function, grantee FROM pgqueue_0008_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s',
                       '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval)',
                       v_grant.grantee);
    END LOOP;
END;
$$;

DROP FUNCTION {schema}.lease_jobs_observed(text[], text, integer, integer, timestamptz);
DROP FUNCTION {schema}.enqueue_batch_traced(jsonb, jsonb, boolean);

ALTER TABLE {schema}.jobs DROP COLUMN trace_context;
