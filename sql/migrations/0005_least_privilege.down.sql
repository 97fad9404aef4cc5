-- Reverts 0005_least_privilege: the functions of 0001-0004 as they were,
-- no CHECK constraints, limits, recorded grants or fenced functions.
-- Privileges of roles granted with `pgqueue grant` are not restored: run
-- `pgqueue grant` again after a downgrade.
DROP FUNCTION {schema}.register_periodic(text, text, text, text, text, jsonb, smallint, integer, boolean, timestamptz);
DROP FUNCTION {schema}.job_status(bigint);
DROP FUNCTION {schema}.extend(bigint, bigint, integer);
DROP FUNCTION {schema}.nack(bigint, bigint);
DROP FUNCTION {schema}.fail(bigint, bigint, text, timestamptz, boolean);
DROP FUNCTION {schema}.ack_many(bigint[], bigint[]);
DROP FUNCTION {schema}.ack(bigint, bigint, jsonb);
DROP FUNCTION {schema}.lease(text[], text, integer);
DROP FUNCTION {schema}.fire_schedules(text[], timestamptz[], bigint[], timestamptz[], timestamptz[], timestamptz[], jsonb[]);
DROP FUNCTION {schema}.watch_job(bigint);
DROP FUNCTION {schema}.reap_jobs(integer, timestamptz);
DROP FUNCTION {schema}.extend_jobs(bigint[], bigint[], float8[], timestamptz);
DROP FUNCTION {schema}.release_jobs(bigint[], bigint[], timestamptz);
DROP FUNCTION {schema}.fail_jobs(bigint[], bigint[], text[], timestamptz[], float8[], boolean[], text[], text[], text[], timestamptz);
DROP FUNCTION {schema}.ack_jobs(bigint[], bigint[], jsonb[], timestamptz, text[]);

ALTER TABLE {schema}.jobs
    DROP CONSTRAINT jobs_run_at_range,
    DROP CONSTRAINT jobs_lease_seconds_positive,
    DROP CONSTRAINT jobs_max_attempts_not_negative,
    DROP CONSTRAINT jobs_backoff_range;
ALTER TABLE {schema}.schedules DROP CONSTRAINT schedules_fire_at_range;
ALTER TABLE {schema}.schedules DROP CONSTRAINT schedules_max_attempts_check;
UPDATE {schema}.schedules SET max_attempts = NULL WHERE max_attempts = 0;
ALTER TABLE {schema}.schedules ADD CONSTRAINT schedules_max_attempts_check CHECK (max_attempts > 0);
DROP TABLE {schema}.periodic_schedules;

-- The definitions before 0005 (0001's, with the settings of 0003 and 0004,
-- and 0009's enqueue_rows and enqueue_batch).
CREATE OR REPLACE FUNCTION {schema}.enqueue_rows(p_jobs jsonb, p_only bigint[] DEFAULT NULL)
RETURNS TABLE (ord bigint, job_id bigint, queue text, dedup_key text)
LANGUAGE sql AS $$
    WITH input AS MATERIALIZED (
        SELECT nextval('{schema}.jobs_id_seq') AS id, i.*
        FROM {schema}.enqueue_input(p_jobs) i
        WHERE p_only IS NULL OR i.ord = ANY (p_only)
    ),
    inserted AS (
        INSERT INTO {schema}.jobs AS j (
            id, task, payload, queue, priority, run_at, status, max_attempts,
            lease_seconds, dedup_key, serial_key,
            backoff_base, backoff_factor, backoff_max, backoff_jitter)
        SELECT i.id, i.task, i.payload, i.queue, i.priority, i.run_at, i.status, i.max_attempts,
               i.lease_seconds, i.dedup_key, i.serial_key,
               i.backoff_base, i.backoff_factor, i.backoff_max, i.backoff_jitter
        FROM input i
        ORDER BY i.ord
        ON CONFLICT (queue, dedup_key)
            WHERE dedup_key IS NOT NULL AND status IN ('queued', 'scheduled', 'running')
        DO NOTHING
        RETURNING j.id, j.queue, j.status
    ),
    per_queue AS (
        SELECT d.queue, count(*) AS n, count(*) FILTER (WHERE d.status = 'queued') AS ready,
               min(d.id) AS job_id
        FROM inserted d GROUP BY d.queue
    ),
    registered AS (
        INSERT INTO {schema}.queues (name) SELECT p.queue FROM per_queue p
        ON CONFLICT (name) DO NOTHING
    ),
    notified AS (
        SELECT count({schema}.notify_enqueued(p.queue, p.n, p.ready, p.job_id)) AS n
        FROM per_queue p
    )
    SELECT i.ord, d.id, i.queue, i.dedup_key
    FROM input i
    LEFT JOIN inserted d ON d.id = i.id
    CROSS JOIN notified
$$;


CREATE OR REPLACE FUNCTION {schema}.retry_delay(
    p_attempt integer, p_base real, p_factor real, p_max real, p_jitter real
) RETURNS interval
LANGUAGE sql VOLATILE AS $$
    -- The exponent is capped where the delay passes max, so that no attempt
    -- count overflows a float.
    SELECT make_interval(secs => greatest(0.0, least(b.max, CASE
            WHEN b.base <= 0 THEN 0.0
            WHEN b.factor <= 1 THEN b.base
            ELSE b.base * power(b.factor::float8, least(greatest(p_attempt - 1, 0),
                                ln(greatest(b.max, b.base) / b.base) / ln(b.factor) + 1))
        END) * (1.0 + b.jitter * (2.0 * random() - 1.0))))
    FROM (SELECT coalesce(p_base, 1.0)::float8 AS base, coalesce(p_factor, 2.0)::float8 AS factor,
                 coalesce(p_max, 3600.0)::float8 AS max, coalesce(p_jitter, 0.1)::float8 AS jitter) b
$$;

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
    CROSS JOIN LATERAL (SELECT coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay, 0)))
                        AS run_at) t
$$;

CREATE OR REPLACE FUNCTION {schema}.enqueue_batch(p_jobs jsonb)
RETURNS TABLE (job_id bigint, created boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_jobs    jsonb := p_jobs;
    v_dedup   boolean;
    v_rows    {schema}.enqueued[];
    v_missing bigint[];
BEGIN
    IF jsonb_typeof(p_jobs) = 'object' THEN
        v_jobs := p_jobs -> 'jobs';
        v_dedup := (p_jobs ->> 'dedup')::boolean;
    END IF;
    IF v_dedup IS NULL THEN
        v_dedup := jsonb_path_exists(v_jobs, '$[*] ? (exists(@.dedup_key))');
    END IF;

    IF NOT v_dedup THEN
        -- Nothing can conflict: one plain insert. Ids are drawn from the
        -- sequence in input order, so sorted ids are in input order too.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO {schema}.jobs AS j (
                id, task, payload, queue, priority, run_at, status, max_attempts,
                lease_seconds, dedup_key, serial_key, backoff_base, backoff_factor,
                backoff_max, backoff_jitter)
            SELECT nextval('{schema}.jobs_id_seq'), i.task, i.payload, i.queue, i.priority,
                   i.run_at, i.status, i.max_attempts, i.lease_seconds, i.dedup_key,
                   i.serial_key, i.backoff_base, i.backoff_factor, i.backoff_max,
                   i.backoff_jitter
            FROM {schema}.enqueue_input(v_jobs) i
            RETURNING j.id, j.queue, j.status
        ),
        per_queue AS (
            SELECT d.queue, count(*) AS n, count(*) FILTER (WHERE d.status = 'queued') AS ready,
                   min(d.id) AS job_id
            FROM inserted d GROUP BY d.queue
        ),
        registered AS (
            INSERT INTO {schema}.queues (name) SELECT p.queue FROM per_queue p
            ON CONFLICT (name) DO NOTHING
        ),
        notified AS (
            SELECT count({schema}.notify_enqueued(p.queue, p.n, p.ready, p.job_id)) AS n
            FROM per_queue p
        )
        SELECT d.id, true FROM inserted d CROSS JOIN notified ORDER BY d.id;
        RETURN;
    END IF;

    SELECT array_agg(ROW(e.ord, e.job_id, e.job_id IS NOT NULL, e.queue, e.dedup_key)::{schema}.enqueued)
    INTO v_rows FROM {schema}.enqueue_rows(v_jobs) e;
    FOR attempt IN 1..10 LOOP
        -- A new statement, so a new snapshot: it sees the live duplicate that
        -- made the insert skip (committed before, or inserted by this batch).
        SELECT array_agg(ROW(r.ord, coalesce(r.job_id, live.id), r.created, r.queue,
                             r.dedup_key)::{schema}.enqueued)
        INTO v_rows
        FROM unnest(v_rows) r
        LEFT JOIN LATERAL (
            SELECT j.id FROM {schema}.jobs j
            WHERE r.job_id IS NULL AND j.queue = r.queue AND j.dedup_key = r.dedup_key
              AND j.status IN ('queued', 'scheduled', 'running')
            LIMIT 1
        ) live ON true;
        SELECT array_agg(r.ord) INTO v_missing FROM unnest(v_rows) r WHERE r.job_id IS NULL;
        IF v_missing IS NULL THEN
            RETURN QUERY SELECT r.job_id, r.created FROM unnest(v_rows) r ORDER BY r.ord;
            RETURN;
        END IF;
        -- The live duplicate finished in between: enqueue those after all.
        SELECT array_agg(ROW(r.ord, coalesce(r.job_id, e.job_id),
                             r.created OR e.job_id IS NOT NULL, r.queue, r.dedup_key)::{schema}.enqueued)
        INTO v_rows
        FROM unnest(v_rows) r
        LEFT JOIN {schema}.enqueue_rows(v_jobs, v_missing) e ON e.ord = r.ord;
    END LOOP;
    RAISE EXCEPTION 'pgqueue: dedup keys kept changing under this enqueue; retry it'
        USING ERRCODE = '40001';
END;
$$;

ALTER FUNCTION {schema}.enqueue_batch(jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = auto SET enable_seqscan = off SET jit = off;

-- (0007 renamed 0001's enqueue() to enqueue_plain.)
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

CREATE OR REPLACE FUNCTION {schema}.lease_jobs(
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
-- Plan every statement with the table as it is now. A plan cached while the
-- table was empty (or before autovacuum analyzed a sudden backlog) would scan
-- and sort the whole table on every lease.
SET plan_cache_mode = force_custom_plan
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

ALTER FUNCTION {schema}.lease_jobs(text[], text, integer, integer, timestamptz)
    SET plan_cache_mode = auto
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off;

DROP FUNCTION {schema}.check_job(bigint, text, jsonb, text, integer, timestamptz, float8, integer, integer, text, text, real[], integer);
DROP FUNCTION {schema}.check_quotas(jsonb);
DROP FUNCTION {schema}.trusted_clock(timestamptz);
DROP TABLE {schema}.role_grants;
DROP TABLE {schema}.limits;

ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT EXECUTE ON FUNCTIONS TO PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO PUBLIC;
REVOKE EXECUTE ON FUNCTION
    {schema}.enqueue_plain(text, jsonb, text, integer, timestamptz, integer, text, text),
    {schema}.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, interval, interval),
    {schema}.enqueue_windowed(jsonb),
    {schema}.dedup_claim(text, text, interval, interval, jsonb),
    {schema}.dedup_lock(bigint[]),
    {schema}.dedup_lock_key(text, text),
    {schema}.enqueue_batch(jsonb),
    {schema}.enqueue_rows(jsonb, bigint[])
FROM PUBLIC;
