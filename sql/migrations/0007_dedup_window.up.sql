-- pgqueue revision 0007: uniqueness over time (dedup_window) and debounce.
--
-- A windowed enqueue (dedup_window) creates no job when one with the same
-- (queue, dedup_key) was created within the window, finished or not; a
-- debounced enqueue (debounce) replaces the payload of the queued job holding
-- the key and moves its run_at to now + debounce. Both are decided under a
-- transaction-level advisory lock per (queue, dedup_key), taken before the
-- lookup: in READ COMMITTED every later statement of the function sees what
-- the previous holder committed, so concurrent producers serialise per key
-- and never both create. Under REPEATABLE READ or SERIALIZABLE a snapshot
-- taken before the wait would not see the other producer's job, so a
-- contended key raises a serialization failure (40001) instead: retry.
--
-- Plain enqueues are untouched: the 0001-0006 enqueue() is kept as
-- enqueue_plain and the new SQL API delegates to it, so its validation stays
-- one body.

-- Window lookups: the newest job of a key, live or finished.
CREATE INDEX jobs_dedup_created_idx ON {schema}.jobs (queue, dedup_key, created_at)
    WHERE dedup_key IS NOT NULL;
CREATE INDEX jobs_archive_dedup_created_idx ON {schema}.jobs_archive (queue, dedup_key, created_at)
    WHERE dedup_key IS NOT NULL;

-- The advisory lock key of (queue, dedup_key) in this schema.
CREATE FUNCTION {schema}.dedup_lock_key(p_queue text, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended('{schema}' || E'\n' || p_queue || E'\n' || p_key, 0);

-- Takes the transaction-level locks of these keys in ascending order, so
-- that two batches sharing keys cannot deadlock. A contended key under
-- REPEATABLE READ/SERIALIZABLE is a serialization failure (the snapshot
-- predates what the holder will commit).
CREATE FUNCTION {schema}.dedup_lock(p_keys bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key bigint;
BEGIN
    FOR v_key IN SELECT DISTINCT k FROM unnest(p_keys) k WHERE k IS NOT NULL ORDER BY k LOOP
        IF NOT pg_try_advisory_xact_lock(v_key) THEN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'pgqueue: another transaction is enqueueing the same dedup key; '
                                'retry this transaction'
                    USING ERRCODE = '40001',
                          HINT = 'windowed and debounced enqueues wait for each other under READ COMMITTED';
            END IF;
            PERFORM pg_advisory_xact_lock(v_key);
        END IF;
    END LOOP;
END;
$$;

-- With the key's lock held (dedup_lock): debounce → the queued job holding
-- the key gets the new payload and run_at = now() + p_debounce (its id is
-- returned); window → the id of the newest job created within p_window.
-- NULL: create the job. Internal, like enqueue_rows: only the definer
-- functions below call it, as their owner under their pinned search_path.
CREATE FUNCTION {schema}.dedup_claim(
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

-- enqueue_batch for documents whose jobs may carry "dedup_window" and
-- "debounce" (seconds). Every such key is locked first (dedup_lock); then,
-- in input order, each is settled by dedup_claim, and the jobs to create
-- (with the plain ones) go to enqueue_batch together — flushed early when a
-- key repeats, so that the later job sees the earlier one. Rows in input order.
CREATE FUNCTION {schema}.enqueue_windowed(p_jobs jsonb)
RETURNS TABLE (job_id bigint, created boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job      jsonb;
    v_ord      bigint;
    v_slot     bigint;
    v_window   float8;
    v_debounce float8;
    v_queue    text;
    v_lock     text;
    v_id       bigint;
    v_created  boolean;
    v_ids      bigint[] := '{}';
    v_news     boolean[] := '{}';
    v_pending  jsonb[] := '{}';
    v_at       bigint[] := '{}';
    v_repeats  text[];
    v_keys     text[] := '{}';
BEGIN
    IF jsonb_typeof(p_jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgqueue: enqueue_windowed takes a JSON array of jobs' USING ERRCODE = '22023';
    END IF;
    PERFORM {schema}.dedup_lock(ARRAY(
        SELECT {schema}.dedup_lock_key(coalesce(e ->> 'queue', 'default'), e ->> 'dedup_key')
        FROM jsonb_array_elements(p_jobs) e
        WHERE (e ->> 'dedup_window') IS NOT NULL OR (e ->> 'debounce') IS NOT NULL));
    -- Keys that occur more than once (rare): only those need the early flush.
    v_repeats := ARRAY(
        SELECT coalesce(e ->> 'queue', 'default') || E'\n' || (e ->> 'dedup_key')
        FROM jsonb_array_elements(p_jobs) e
        WHERE (e ->> 'dedup_window') IS NOT NULL OR (e ->> 'debounce') IS NOT NULL
        GROUP BY 1 HAVING count(*) > 1);
    FOR v_job, v_ord IN SELECT e.value, e.ordinality FROM jsonb_array_elements(p_jobs) WITH ORDINALITY e
    LOOP
        v_window := (v_job ->> 'dedup_window')::float8;
        v_debounce := (v_job ->> 'debounce')::float8;
        IF v_window IS NOT NULL OR v_debounce IS NOT NULL THEN
            v_queue := coalesce(v_job ->> 'queue', 'default');
            v_lock := v_queue || E'\n' || coalesce(v_job ->> 'dedup_key', '');
            IF cardinality(v_repeats) > 0 AND v_lock = ANY (v_keys) THEN
                -- The key's earlier job of this batch must exist before this one is settled.
                FOR v_id, v_created, v_slot IN
                    SELECT b.job_id, b.created, v_at[b.n]
                    FROM {schema}.enqueue_batch(to_jsonb(v_pending)) WITH ORDINALITY AS b(job_id, created, n)
                LOOP
                    v_ids[v_slot] := v_id;
                    v_news[v_slot] := v_created;
                END LOOP;
                v_pending := '{}';
                v_at := '{}';
                v_keys := '{}';
            END IF;
            IF v_debounce IS NOT NULL AND (v_job ? 'run_at' OR v_job ? 'delay') THEN
                RAISE EXCEPTION 'pgqueue: debounce sets run_at to now + debounce; give no run_at or delay'
                    USING ERRCODE = '22023';
            END IF;
            v_id := {schema}.dedup_claim(
                v_queue, v_job ->> 'dedup_key',
                make_interval(secs => v_window), make_interval(secs => v_debounce),
                coalesce(v_job -> 'payload', '{}'));
            IF v_id IS NOT NULL THEN
                v_ids[v_ord] := v_id;
                v_news[v_ord] := false;
                CONTINUE;
            END IF;
            v_job := v_job - 'dedup_window' - 'debounce';
            IF v_debounce IS NOT NULL THEN
                v_job := v_job || jsonb_build_object('delay', v_debounce);
            END IF;
            IF v_lock = ANY (v_repeats) THEN
                v_keys := v_keys || v_lock;
            END IF;
        END IF;
        v_pending := v_pending || v_job;
        v_at := v_at || v_ord;
    END LOOP;
    IF cardinality(v_pending) > 0 THEN
        FOR v_id, v_created, v_slot IN
            SELECT b.job_id, b.created, v_at[b.n]
            FROM {schema}.enqueue_batch(to_jsonb(v_pending)) WITH ORDINALITY AS b(job_id, created, n)
        LOOP
            v_ids[v_slot] := v_id;
            v_news[v_slot] := v_created;
        END LOOP;
    END IF;
    RETURN QUERY SELECT u.id, u.created FROM unnest(v_ids, v_news) AS u(id, created);
END;
$$;

-- The SQL API gains dedup_window and debounce. A new signature is a new
-- function: the previous one is kept, renamed, as the plain path.
ALTER FUNCTION {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text)
    RENAME TO enqueue_plain;

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
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval),
    {schema}.enqueue_windowed(jsonb),
    {schema}.dedup_claim(text, text, interval, interval, jsonb),
    {schema}.dedup_lock(bigint[]),
    {schema}.dedup_lock_key(text, text)
FROM PUBLIC;

-- Roles that could enqueue keep that right through the new functions.
DO $grants$
DECLARE
    v_role text;
BEGIN
    FOR v_role IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = '{schema}.enqueue_plain(text, jsonb, text, integer, timestamptz, integer, text, text)'::regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       '{schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval), '
                       '{schema}.enqueue_windowed(jsonb) TO %s', v_role);
    END LOOP;
END;
$grants$;
